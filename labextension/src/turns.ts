/**
 * A request typed in the sidebar runs as a soba turn in the notebook's kernel (SPEC §18): the
 * same path as `%soba` in a cell — the request is sent as a `%%soba` cell body (verbatim:
 * a cell magic's body is never re-parsed), not stored in the history (no `In [n]`, and the
 * recorder leaves soba's magics out of the notebook context). The kernel's `turn` messages
 * on the comm show the conversation; what such a request prints without a turn (a slash
 * command's lines, a one-line refusal) comes back from this request's own output.
 *
 * Approval questions: the kernel asks with `input()`, which reaches the frontend that sent
 * the request as a stdin request — this one — so the panel asks the user and answers it.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';

/** Run quietly before a request from the sidebar: the extension, if the notebook has not loaded it. */
export const LOAD_SOBA = '%load_ext soba_nb';

/** The code a request runs as: `%%soba` and the request, verbatim, as the cell body. */
export function turnCode(text: string): string {
  return `%%soba\n${text}`;
}

/** `%soba /fix --cell N`: the Fix button's request for the failed cell In [N]. */
export function fixCode(executionCount: number): string {
  return turnCode(`/fix --cell ${executionCount}`);
}

/** An approval question waiting for the user's answer in the panel. */
export interface IQuestion {
  prompt: string;
  answer(value: string): void;
}

/** What a request printed outside a turn, and how it ended. */
export interface IRequestEnd {
  /** Text the request printed (stream, text/plain displays, the error line). */
  output: string;
  ok: boolean;
}

const MAX_OUTPUT_CHARS = 4000;

/** The plain text of one iopub output (what a request printed). */
function outputText(msg: KernelMessage.IIOPubMessage): string {
  if (KernelMessage.isStreamMsg(msg)) {
    return msg.content.text;
  }
  if (KernelMessage.isDisplayDataMsg(msg) || KernelMessage.isExecuteResultMsg(msg)) {
    const plain = msg.content.data['text/plain'];
    return typeof plain === 'string' ? `${plain}\n` : '';
  }
  if (KernelMessage.isErrorMsg(msg)) {
    return `${msg.content.ename}: ${msg.content.evalue}\n`;
  }
  return '';
}

/**
 * Run `code` in `kernel`; `onQuestion` is called for each approval question (null when it is
 * answered or the request ended). Resolves when the kernel has answered the request.
 */
export async function runRequest(
  kernel: Kernel.IKernelConnection,
  code: string,
  onQuestion: (question: IQuestion | null) => void,
  silent = false
): Promise<IRequestEnd> {
  const future = kernel.requestExecute(
    { code, silent, store_history: false, allow_stdin: !silent, stop_on_error: false },
    true
  );
  let output = '';
  let ok = true;
  future.onIOPub = msg => {
    if (KernelMessage.isErrorMsg(msg)) {
      ok = false;
    }
    if (output.length < MAX_OUTPUT_CHARS) {
      output = (output + outputText(msg)).slice(0, MAX_OUTPUT_CHARS);
    }
  };
  future.onStdin = msg => {
    if (!KernelMessage.isInputRequestMsg(msg)) {
      return;
    }
    let answered = false;
    onQuestion({
      prompt: msg.content.prompt,
      answer: value => {
        if (answered || future.isDisposed) {
          return;
        }
        answered = true;
        future.sendInputReply({ status: 'ok', value }, msg.header);
        onQuestion(null);
      }
    });
  };
  try {
    const reply = await future.done;
    ok = ok && reply?.content.status === 'ok';
  } catch {
    ok = false; // the kernel died, restarted or was interrupted
  } finally {
    onQuestion(null);
  }
  return { output, ok };
}
