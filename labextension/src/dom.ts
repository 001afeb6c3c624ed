/**
 * The one DOM helper the panel, the conversation and the edit diffs share: an element with a
 * class and, when given, its text — always `textContent`, never HTML (what a model, a server
 * or a file wrote is shown as text).
 */
export function el(tag: string, className: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}
