#!/usr/bin/env bash
# Unpack a pinned QEMU from Debian bookworm-backports into a private prefix, beside the system's QEMU (which is
# not touched): `make qemu10` runs it. Idempotent: when PREFIX/.installed names the same versions, it does nothing
# (no network). apt reads a private source list and state under APT_DIR, so /etc/apt is not changed either.
#
#   scripts/install-qemu.sh PREFIX APT_DIR QEMU_VERSION SEABIOS_VERSION
#
# Packages: qemu-system-x86, qemu-system-common, qemu-system-data (QEMU_VERSION) and seabios (SEABIOS_VERSION:
# QEMU 10's microvm firmware, bios-microvm.bin, is SeaBIOS's). Their library dependencies come from bookworm
# itself (installed with apt-get when missing). QEMU then runs with CRYOBOX_QEMU=PREFIX/usr/bin/qemu-system-x86_64;
# cryobox passes -L PREFIX/usr/share/{qemu,seabios} (Debian builds it non-relocatable).
set -euo pipefail

prefix=${1:?prefix} apt_dir=${2:?apt dir} qemu_version=${3:?qemu version} seabios_version=${4:?seabios version}
packages=("qemu-system-x86=$qemu_version" "qemu-system-common=$qemu_version" "qemu-system-data=$qemu_version"
  "seabios=$seabios_version")
stamp="$prefix/.installed"
want=$(printf '%s\n' "${packages[@]}")

if [[ -f $stamp && "$(cat "$stamp")" == "$want" && -x $prefix/usr/bin/qemu-system-x86_64 ]]; then
  exit 0
fi

mkdir -p "$apt_dir/etc" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
cat >"$apt_dir/etc/bookworm-backports.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir/etc"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "APT::Sandbox::User=root")

echo "installing ${packages[*]} into $prefix"
apt-get -q "${apt_opts[@]}" update
rm -f "$apt_dir"/debs/*.deb
(cd "$apt_dir/debs" && apt-get -q "${apt_opts[@]}" download "${packages[@]}")

# the binary's shared libraries, from bookworm (most come with the system QEMU 7.2 already)
deps=$(dpkg-deb -f "$apt_dir"/debs/qemu-system-x86_*.deb Depends; dpkg-deb -f "$apt_dir"/debs/qemu-system-common_*.deb Depends)
missing=()
for dep in $(echo "$deps" | tr ',' '\n' | sed -E 's/\(.*\)//; s/\|.*//; s/[[:space:]]//g' | sort -u); do
  case $dep in qemu-* | seabios | ipxe-qemu | "") continue ;; esac
  dpkg -s "$dep" >/dev/null 2>&1 || missing+=("$dep")
done
if ((${#missing[@]})); then
  echo "installing libraries from bookworm: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

mkdir -p "$(dirname "$prefix")"
tmp=$(mktemp -d "$prefix.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for deb in "$apt_dir"/debs/*.deb; do
  dpkg-deb -x "$deb" "$tmp"
done
chmod 755 "$tmp"
# checks: it runs, every library resolves, its firmware is there
"$tmp/usr/bin/qemu-system-x86_64" --version | head -1
if ldd "$tmp/usr/bin/qemu-system-x86_64" | grep 'not found'; then
  echo "install-qemu: unresolved libraries" >&2
  exit 1
fi
for rom in usr/share/seabios/bios-microvm.bin usr/share/qemu/linuxboot_dma.bin; do
  [[ -f $tmp/$rom ]] || { echo "install-qemu: $rom missing" >&2; exit 1; }
done
echo "$want" >"$tmp/.installed"
rm -rf "$prefix"
mv "$tmp" "$prefix"
trap - EXIT
rm -f "$apt_dir"/debs/*.deb
echo "QEMU ready: CRYOBOX_QEMU=$prefix/usr/bin/qemu-system-x86_64"
