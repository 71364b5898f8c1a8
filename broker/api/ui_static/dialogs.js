// The confirmation dialog: destructive actions (purge, delete, close) ask first.
// A native <dialog> opened with showModal() keeps the focus inside it, and Escape
// cancels; the focus starts on Cancel, the safe choice.


export function confirmAction(text, yesLabel = "Yes") {
  return new Promise((resolve) => {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-text").textContent = text;
    document.getElementById("confirm-yes").textContent = yesLabel;
    dialog.returnValue = "";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.showModal();
    document.getElementById("confirm-no").focus();
  });
}
