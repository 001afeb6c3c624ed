/**
 * The panel's buttons talk to the kernel over the `soba_nb.control` comm target
 * (its Python side is `soba_nb/notebook/controls.py`, which documents the same shapes).
 *
 * One comm per request: open it, send the request, wait for the one answer, close it. A
 * kernel without the target (the extension is not loaded there) closes the comm at once,
 * which the panel reports as `NOT_LOADED`. Cancel is not a request: it interrupts the
 * kernel through the server, the only thing that reaches a running cell.
 */

import { Kernel } from '@jupyterlab/services';

/** The comm target `%load_ext soba_nb` registers on the kernel. */
export const CONTROL_TARGET = 'soba_nb.control';

/** What the panel says when the kernel has no control target. */
export const NOT_LOADED = 'run %load_ext soba_nb in this notebook first';

/** What the panel says when the notebook has no kernel to ask. */
export const NO_KERNEL = 'this notebook has no running kernel';

/** `%compact [focus]`, `%auto_compact on|off`, export the latest capsule to `path`. */
export type ControlRequest =
  | { type: 'compact'; focus?: string | null }
  | { type: 'auto'; on: boolean }
  | { type: 'export'; path: string }
  | { type: 'inbox' };

/** The kernel's answer: the lines the magic printed, or its one-line error. */
export interface IControlAnswer {
  type: 'done';
  request: string;
  ok: boolean;
  text: string;
}

/** The answer in a comm payload, or null when it is not one. */
export function parseAnswer(data: unknown): IControlAnswer | null {
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const fields = data as Record<string, unknown>;
  if (fields.type !== 'done' || typeof fields.ok !== 'boolean' || typeof fields.text !== 'string') {
    return null;
  }
  return {
    type: 'done',
    request: typeof fields.request === 'string' ? fields.request : '',
    ok: fields.ok,
    text: fields.text
  };
}

const failed = (request: ControlRequest, text: string): IControlAnswer => ({
  type: 'done',
  request: request.type,
  ok: false,
  text
});

/**
 * Send `request` to the kernel; resolves with its answer (never rejects). The kernel
 * handles it between cells, so while a cell runs the answer waits for that cell.
 */
export function sendControl(
  kernel: Kernel.IKernelConnection,
  request: ControlRequest
): Promise<IControlAnswer> {
  return new Promise(resolve => {
    let settled = false;
    let comm: Kernel.IComm | null = null;
    const finish = (answer: IControlAnswer): void => {
      if (settled) {
        return;
      }
      settled = true;
      resolve(answer);
      if (comm && !comm.isDisposed) {
        comm.close();
      }
    };
    try {
      comm = kernel.createComm(CONTROL_TARGET);
      comm.onMsg = msg => {
        const answer = parseAnswer(msg.content.data);
        if (answer) {
          finish(answer);
        }
      };
      // Closed by the kernel before any answer: nobody there handles the target.
      comm.onClose = () => finish(failed(request, NOT_LOADED));
      comm.open({});
      comm.send({ ...request });
    } catch (reason) {
      finish(failed(request, `could not reach the kernel: ${String(reason)}`));
    }
  });
}

/** The default export file: `<notebook-stem>.capsule.md`, next to the notebook. */
export function capsuleFileName(notebookPath: string): string {
  const name = notebookPath.split('/').pop() ?? notebookPath;
  const stem = name.replace(/\.ipynb$/i, '');
  return `${stem || 'notebook'}.capsule.md`;
}
