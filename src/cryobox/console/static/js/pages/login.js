// #/login: an API key field; POST /ui/login sets the HttpOnly session cookie. The field is cleared at once.
import { errorText } from "../api.js";
import { h } from "../dom.js";

export function loginPage(app, root) {
  const key = h("input", {
    type: "password",
    name: "api_key",
    autocomplete: "off",
    testid: "login-key",
    placeholder: "cbx_…",
    required: true,
  });
  const error = h("p", { class: "error", testid: "login-error", role: "alert" });
  const submit = h("button", { type: "submit", class: "primary", testid: "login-submit" }, "Log in");
  const form = h(
    "form",
    { class: "login card", testid: "login-form" },
    h("h1", null, "cryobox console"),
    h("p", { class: "muted" }, "Log in with a workspace API key. It is sent once and kept by the server's session."),
    h("label", null, "API key", key),
    submit,
    error,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = key.value;
    key.value = "";
    error.textContent = "";
    submit.disabled = true;
    try {
      const session = await app.api.request("POST", "/ui/login", { json: { api_key: value }, noRedirect: true });
      app.loggedInAs(session);
      app.go("#/sandboxes");
    } catch (err) {
      error.textContent = err.status === 401 ? "That API key was not accepted." : errorText(err);
    } finally {
      submit.disabled = false;
    }
  });
  root.append(h("div", { class: "login-wrap", testid: "page-login" }, form));
  key.focus();
}
