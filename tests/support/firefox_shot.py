"""Screenshot the console's login page in Debian's Firefox ESR (``firefox-esr --headless --screenshot``), run by
:mod:`tests.integration.console.test_firefox` inside a fresh network namespace (``unshare --net``) that has only
a loopback interface: the page's files are served from here, in the namespace, with the console's CSP, and
nothing Firefox tries to reach elsewhere can leave the namespace.

Usage: ``python -m tests.support.firefox_shot <static dir> <profile dir> <out.png>``."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryobox.console.static import SECURITY_HEADERS

PREFS = """\
user_pref("app.update.enabled", false);
user_pref("browser.safebrowsing.malware.enabled", false);
user_pref("browser.safebrowsing.phishing.enabled", false);
user_pref("browser.shell.checkDefaultBrowser", false);
user_pref("datareporting.policy.dataSubmissionEnabled", false);
user_pref("network.captive-portal-service.enabled", false);
user_pref("network.connectivity-service.enabled", false);
user_pref("toolkit.telemetry.enabled", false);
"""


def handler(static: Path) -> type[SimpleHTTPRequestHandler]:
    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(static), **kwargs)  # type: ignore[arg-type]

        def translate_path(self, path: str) -> str:
            path = path.split("?", 1)[0]
            if path in ("/ui", "/ui/"):
                return str(static / "index.html")
            return super().translate_path(path.removeprefix("/ui"))

        def end_headers(self) -> None:
            for name, value in SECURITY_HEADERS:
                self.send_header(name.decode(), value.decode())
            super().end_headers()

        def do_GET(self) -> None:
            if self.path.startswith("/ui/session") or self.path.startswith("/ui/api/"):
                body = b'{"error": "not logged in", "code": "unauthorized"}'
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def main(static: Path, profile: Path, out: Path) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "user.js").write_text(PREFS)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(static))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/ui/#/login"
    argv = ["firefox-esr", "--headless", "--no-remote", "--profile", str(profile)]
    argv += ["--window-size=1280,800", "--screenshot", str(out), url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    server.shutdown()
    sys.stderr.write(done.stderr[-2000:])
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
