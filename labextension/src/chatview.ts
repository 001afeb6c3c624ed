/**
 * The conversation in the sidebar (SPEC §18), as DOM: the messages, the approval question,
 * the queue and the prompt box. Its elements carry the public `data-soba-role` names:
 * `message` (with `data-soba-author` `user` or `assistant`), `prompt`, `send`, `steer`,
 * `queue-item`; and `receipt`, `approval`, `approval-call`, `approve`, `decline`, `approve-all`,
 * `steer-pending`, `queue-remove`.
 *
 * What the model or a server wrote is never HTML here: messages and receipts are text
 * (`textContent`); an answer's Markdown goes through JupyterLab's Markdown renderer as an
 * untrusted output (sanitized: no script, no event handler, no raw HTML that runs), as the
 * same answer is shown in the cell; the call an approval question is about is escaped text
 * in a `<pre>`, whole (the kernel escaped its control characters).
 *
 * The prompt box and the buttons are built once and only their state changes, so a redraw
 * while a turn streams never swallows what the user is typing or a click.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { IRenderMimeRegistry, MimeModel } from '@jupyterlab/rendermime';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { ServerConnection } from '@jupyterlab/services';

import { IItem } from './conversation';
import { IChatState } from './chat';
import { IBudgetState } from './store';
import { el } from './dom';

const MARKDOWN = 'text/markdown';

/** What the view asks its owner to do. */
export interface IChatActions {
  submit(text: string): void;
  steer(text: string): void;
  answer(value: string): void;
  editQueued(id: string, text: string): void;
  removeQueued(id: string): void;
}

function role<T extends HTMLElement>(node: T, name: string): T {
  node.dataset.sobaRole = name;
  return node;
}

function button(label: string, name: string, title: string, onClick: () => void) {
  const node = role(el('button', `soba-Chat-button jp-Button soba-Chat-${name}`, label), name);
  node.setAttribute('type', 'button');
  node.title = title;
  node.addEventListener('click', onClick);
  return node as HTMLButtonElement;
}

/**
 * Images in an answer are not fetched: a URL the model wrote (perhaps told to by a file it
 * read) could carry the session's data to another server. The sanitized HTML is read in an
 * inert document (nothing there loads) and each image not embedded as `data:` becomes a
 * line naming it, before anything reaches the page.
 */
export class NoRemoteImages implements IRenderMime.ISanitizer {
  constructor(private readonly _base: IRenderMime.ISanitizer) {}

  sanitize(dirty: string, options?: IRenderMime.ISanitizerOptions): string {
    const clean = this._base.sanitize(dirty, options);
    const inert = new DOMParser().parseFromString(`<body>${clean}</body>`, 'text/html');
    inert.querySelectorAll('img, image, picture, source, video, audio').forEach(node => {
      const source = node.getAttribute('src') ?? node.getAttribute('srcset') ?? '';
      if (!source.startsWith('data:')) {
        node.replaceWith(inert.createTextNode(`[image not loaded: ${source}]`));
      }
    });
    return inert.body.innerHTML;
  }

  getAutolink(): boolean {
    return this._base.getAutolink?.() ?? false;
  }

  get allowNamedProperties(): boolean | undefined {
    return this._base.allowNamedProperties;
  }
}

/** One item's node (a message, a receipt, a line). */
function itemNode(item: IItem, rendermime: IRenderMimeRegistry | null): HTMLElement {
  switch (item.kind) {
    case 'user':
    case 'assistant': {
      const node = role(el('div', `soba-Chat-message soba-Chat-${item.kind}`), 'message');
      node.dataset.sobaAuthor = item.kind;
      if (item.steer) {
        node.dataset.sobaSteer = 'true';
        node.append(el('div', 'soba-Chat-label', 'steer'));
      }
      const body = el('div', 'soba-Chat-text');
      node.append(body);
      if (item.kind === 'assistant' && rendermime) {
        const renderer = rendermime.createRenderer(MARKDOWN);
        const model = new MimeModel({ data: { [MARKDOWN]: item.text }, trusted: false });
        body.append(renderer.node);
        void renderer.renderModel(model);
      } else {
        body.textContent = item.text;
      }
      return node;
    }
    case 'tool': {
      const node = role(el('div', 'soba-Chat-receipt'), 'receipt');
      node.dataset.status = item.status ?? '';
      node.append(el('div', 'soba-Chat-receiptLine', item.text));
      if (item.preview) {
        node.append(el('pre', 'soba-Chat-preview', item.preview));
      }
      for (const path of item.images ?? []) {
        // The call's image as kept in the session folder, from this Jupyter server.
        const image = document.createElement('img');
        image.className = 'soba-Chat-image';
        image.alt = `image the call displayed: ${path}`;
        image.src = URLExt.join(ServerConnection.makeSettings().baseUrl, 'files', URLExt.encodeParts(path));
        node.append(image);
      }
      return node;
    }
    case 'approval': {
      const node = role(el('div', 'soba-Chat-approvalCall'), 'approval-call');
      node.append(el('div', 'soba-Chat-label', 'asks to run:'), el('pre', 'soba-Chat-call', item.text));
      return node;
    }
    default: {
      const node = el('div', `soba-Chat-line soba-Chat-${item.kind}`, item.text);
      node.dataset.status = item.status ?? '';
      return node;
    }
  }
}

const keyOf = (item: IItem): string =>
  [
    item.kind,
    item.turn,
    item.call ?? '',
    item.status ?? '',
    item.text.length,
    item.text.slice(-64),
    item.preview ?? '',
    (item.images ?? []).join('\n')
  ].join('\u0000');

export class ChatView {
  readonly node = el('section', 'soba-Chat');
  private readonly _messages = el('div', 'soba-Chat-messages');
  private readonly _waiting = el('div', 'soba-Chat-waiting');
  private readonly _question = role(el('div', 'soba-Chat-question'), 'approval');
  private readonly _questionText = el('div', 'soba-Chat-questionText');
  private readonly _steers = el('div', 'soba-Chat-steers');
  private readonly _queue = el('ol', 'soba-Chat-queue');
  private readonly _error = el('div', 'soba-Chat-error');
  private readonly _output = el('pre', 'soba-Chat-output');
  private readonly _prompt = role(document.createElement('textarea'), 'prompt');
  private readonly _send: HTMLButtonElement;
  private readonly _steer: HTMLButtonElement;
  private _nodes: { key: string; node: HTMLElement }[] = [];
  private readonly _rendermime: IRenderMimeRegistry | null;

  constructor(
    private readonly _actions: IChatActions,
    rendermime: IRenderMimeRegistry | null
  ) {
    this._rendermime = rendermime?.clone({ sanitizer: new NoRemoteImages(rendermime.sanitizer) }) ?? null;
    this._messages.setAttribute('role', 'log');
    this._messages.setAttribute('aria-label', 'conversation with soba');
    this._messages.setAttribute('aria-live', 'polite');
    this._waiting.setAttribute('role', 'status');
    this._error.setAttribute('role', 'alert');
    this._prompt.className = 'soba-Chat-prompt';
    this._prompt.rows = 3;
    this._prompt.placeholder = 'Ask soba… (Enter sends, Shift+Enter: new line)';
    this._prompt.setAttribute('aria-label', 'Message soba: Enter sends, Shift+Enter adds a line');
    this._prompt.addEventListener('keydown', event => {
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this._take(text => this._actions.submit(text));
      }
    });
    this._send = button('Send', 'send', 'Send (queued while a turn runs)', () =>
      this._take(text => this._actions.submit(text))
    );
    this._steer = button('Steer', 'steer', 'Send into the running turn, at its next tool call', () =>
      this._take(text => this._actions.steer(text))
    );
    const yes = button('Yes', 'approve', 'Run this call (y)', () => this._actions.answer('y'));
    const no = button('No', 'decline', 'Do not run it: the model is told (n)', () =>
      this._actions.answer('n')
    );
    const all = button('All this turn', 'approve-all', 'Run this call and the rest of this turn without asking (a)', () =>
      this._actions.answer('a')
    );
    const answers = el('div', 'soba-Chat-answers');
    answers.append(yes, no, all);
    this._question.append(this._questionText, answers);
    this._queue.setAttribute('aria-label', 'queued requests: they run in order after the turn');
    const row = el('div', 'soba-Chat-actions');
    row.append(this._send, this._steer);
    this.node.append(
      this._messages,
      this._waiting,
      this._question,
      this._output,
      this._steers,
      this._queue,
      this._error,
      this._prompt,
      row
    );
  }

  focus(): void {
    this._prompt.focus();
  }

  private _take(use: (text: string) => void): void {
    const text = this._prompt.value;
    if (!text.trim()) {
      return;
    }
    this._prompt.value = '';
    use(text);
  }

  /** Show one notebook's conversation and controls. */
  update(budget: IBudgetState, chat: IChatState): void {
    this._updateMessages(budget.conversation.items);
    const { running, waiting } = budget.conversation;
    this._waiting.textContent = waiting ?? '';
    this._waiting.hidden = !waiting;
    this._question.hidden = chat.question === null;
    this._questionText.textContent = chat.question?.prompt ?? '';
    this._output.textContent = chat.output ?? '';
    this._output.hidden = !chat.output;
    this._steers.replaceChildren(
      ...chat.steers.map(text => {
        const node = el('div', 'soba-Chat-pendingSteer', `steer, at the next tool call: ${text}`);
        node.dataset.sobaRole = 'steer-pending';
        return node;
      })
    );
    this._updateQueue(chat);
    this._error.textContent = chat.error ?? '';
    this._error.hidden = !chat.error;
    const busy = running !== null || chat.sending;
    this._send.textContent = busy ? 'Queue' : 'Send';
    this._steer.disabled = running === null;
  }

  private _updateMessages(items: IItem[]): void {
    const atBottom =
      this._messages.scrollHeight - this._messages.scrollTop - this._messages.clientHeight < 40;
    const nodes = items.map((item, index) => {
      const key = keyOf(item);
      const old = this._nodes[index];
      return old && old.key === key ? old : { key, node: itemNode(item, this._rendermime) };
    });
    const changed =
      nodes.length !== this._nodes.length || nodes.some((entry, i) => entry !== this._nodes[i]);
    this._nodes = nodes;
    if (changed) {
      this._messages.replaceChildren(...nodes.map(entry => entry.node));
      if (atBottom) {
        this._messages.scrollTop = this._messages.scrollHeight;
      }
    }
  }

  private _updateQueue(chat: IChatState): void {
    const focused = document.activeElement;
    const editing = focused instanceof HTMLElement && this._queue.contains(focused);
    if (editing) {
      return; // never take a queued request away from under the user's cursor
    }
    this._queue.replaceChildren(
      ...chat.queue.map(item => {
        const node = role(el('li', 'soba-Chat-queueItem'), 'queue-item');
        node.dataset.sobaQueueId = item.id;
        const text = document.createElement('textarea');
        text.className = 'soba-Chat-queueText';
        text.rows = 1;
        text.value = item.text;
        text.setAttribute('aria-label', 'queued request (edit it; emptied, it is removed)');
        text.addEventListener('change', () => this._actions.editQueued(item.id, text.value));
        const remove = button('×', 'queue-remove', 'Remove from the queue', () =>
          this._actions.removeQueued(item.id)
        );
        remove.setAttribute('aria-label', 'Remove from the queue');
        node.append(text, remove);
        return node;
      })
    );
  }
}
