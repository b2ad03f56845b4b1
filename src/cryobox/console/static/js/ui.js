// Dialogs and notices. A <dialog> with showModal() (Chromium and Firefox both have it).
import { h } from "./dom.js";

/**
 * Ask for confirmation. With `input` ({label, value, type}) the dialog has one field and resolves to its value;
 * otherwise it resolves to true. Cancel resolves to null.
 */
export function confirmDialog({ title, message, confirm = "Confirm", danger = false, input = null }) {
  return new Promise((resolve) => {
    const field = input
      ? h("input", {
          testid: "confirm-input",
          type: input.type || "text",
          value: input.value === undefined ? "" : String(input.value),
          min: input.min,
          max: input.max,
        })
      : null;
    const ok = h("button", { type: "submit", class: danger ? "danger" : "primary", testid: "confirm-ok" }, confirm);
    const cancel = h("button", { type: "button", testid: "confirm-cancel" }, "Cancel");
    const form = h(
      "form",
      { method: "dialog" },
      h("h3", null, title),
      message ? h("p", null, message) : null,
      field ? h("label", null, input.label || "", " ", field) : null,
      h("div", { class: "buttons" }, cancel, ok),
    );
    const dialog = h("dialog", { testid: "confirm-dialog" }, form);
    let answer = null;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      answer = field ? field.value : true;
      dialog.close();
    });
    cancel.addEventListener("click", () => dialog.close());
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve(answer);
    });
    document.body.append(dialog);
    dialog.showModal();
    (field || ok).focus();
  });
}

/** A short notice in the corner (text only). */
export function toast(message, kind = "info") {
  const box = document.querySelector("[data-testid=toasts]");
  if (!box) return;
  const item = h("div", { class: `toast ${kind}`, testid: `toast-${kind}` }, message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
}

/** Run `fn` with `button` disabled, reporting a failure as an error toast; returns fn's result or undefined. */
export async function busy(button, fn, errorText) {
  if (button) button.disabled = true;
  try {
    return await fn();
  } catch (err) {
    toast(errorText(err), "error");
    return undefined;
  } finally {
    if (button) button.disabled = false;
  }
}
