/**
 * The sidebar's conversation (SPEC §18): what the kernel says about each turn, as items.
 *
 * The kernel sends `turn` messages on the `soba_nb.monitor` comm for every turn, typed in
 * the prompt box or run as `%soba` in a cell (`soba_nb/notebook/conversation.py` documents
 * them): its start (what the user asked), the answer in pieces, each call's receipt, notices,
 * the wait for the model, approval questions, its end. `reduceTurn` folds them into the list
 * of items the panel shows; a reload starts from the transcript (`fromTranscript`).
 */

/** One thing the panel shows in the conversation. */
export interface IItem {
  /** `user` and `assistant` are messages; the rest are lines between them. */
  kind: 'user' | 'assistant' | 'tool' | 'notice' | 'end' | 'approval';
  /** The turn it belongs to ('' for items read back from the transcript). */
  turn: string;
  text: string;
  /** A tool receipt's call id (its start and end are one item). */
  call?: string;
  /** A receipt's status, a notice's level, a turn's end status. */
  status?: string;
  /** A receipt's first lines of output. */
  preview?: string;
  /** A receipt's images: paths relative to the server's root (served under `files/`). */
  images?: string[];
  /** A user message sent into a running turn. */
  steer?: boolean;
}

/** One notebook's conversation. */
export interface IConversation {
  items: IItem[];
  /** The running turn's id, or null. */
  running: string | null;
  /** The model has not answered yet: what it is doing, or null. */
  waiting: string | null;
}

export const emptyConversation = (): IConversation => ({
  items: [],
  running: null,
  waiting: null
});

/** A `turn` message from the kernel. */
export interface ITurnMessage {
  type: 'turn';
  phase: 'start' | 'text' | 'tool' | 'notice' | 'waiting' | 'approval' | 'end' | 'steer';
  turn: string;
  prompt?: string;
  text?: string;
  line?: string;
  call?: string;
  status?: string;
  preview?: string;
  level?: string;
  /** A receipt's images, relative to the server's root (the store resolves the kernel's). */
  images?: string[];
}

const PHASES: readonly ITurnMessage['phase'][] = [
  'start',
  'text',
  'tool',
  'notice',
  'waiting',
  'approval',
  'end',
  'steer'
];

/** Items kept per notebook: the oldest go first (the transcript keeps them all). */
export const MAX_ITEMS = 500;

const str = (value: unknown): string | undefined =>
  typeof value === 'string' ? value : undefined;

const strings = (value: unknown): string[] | undefined =>
  Array.isArray(value) ? value.filter((item): item is string => typeof item === 'string') : undefined;

/** The turn message in a comm payload, or null when it is not one. */
export function parseTurn(data: Record<string, unknown>): ITurnMessage | null {
  const phase = PHASES.find(known => known === data.phase);
  const turn = str(data.turn);
  if (data.type !== 'turn' || !phase || turn === undefined) {
    return null;
  }
  return {
    type: 'turn',
    phase,
    turn,
    prompt: str(data.prompt),
    text: str(data.text),
    line: str(data.line),
    call: str(data.call),
    status: str(data.status),
    preview: str(data.preview),
    level: str(data.level),
    images: strings(data.images)
  };
}

function appended(items: IItem[], item: IItem): IItem[] {
  const next = [...items, item];
  return next.length > MAX_ITEMS ? next.slice(next.length - MAX_ITEMS) : next;
}

/** The answer's pieces go into the turn's last item when it is its answer, else a new one. */
function withText(items: IItem[], turn: string, text: string): IItem[] {
  const last = items[items.length - 1];
  if (last && last.kind === 'assistant' && last.turn === turn) {
    return [...items.slice(0, -1), { ...last, text: last.text + text }];
  }
  return appended(items, { kind: 'assistant', turn, text });
}

function withReceipt(items: IItem[], message: ITurnMessage): IItem[] {
  const index = items.findIndex(
    item => item.kind === 'tool' && item.turn === message.turn && item.call === message.call
  );
  const item: IItem = {
    kind: 'tool',
    turn: message.turn,
    call: message.call,
    text: message.line ?? '',
    status: message.status,
    preview: message.preview,
    images: message.images
  };
  if (index < 0) {
    return appended(items, item);
  }
  const next = [...items];
  next[index] = item;
  return next;
}

/** A line between the messages (a compaction's result line, as the cell shows it). */
export function withLine(state: IConversation, text: string, status: string): IConversation {
  return {
    ...state,
    items: appended(state.items, { kind: 'notice', turn: state.running ?? '', text, status })
  };
}

/** Apply one `turn` message. */
export function reduceTurn(state: IConversation, message: ITurnMessage): IConversation {
  const { items } = state;
  switch (message.phase) {
    case 'start':
      return {
        items: appended(items, { kind: 'user', turn: message.turn, text: message.prompt ?? '' }),
        running: message.turn,
        waiting: null
      };
    case 'text':
      return { ...state, items: withText(items, message.turn, message.text ?? ''), waiting: null };
    case 'tool':
      return { ...state, items: withReceipt(items, message), waiting: null };
    case 'notice':
      return {
        ...state,
        items: appended(items, {
          kind: 'notice',
          turn: message.turn,
          text: message.line ?? '',
          status: message.level
        })
      };
    case 'steer':
      return {
        ...state,
        items: appended(items, {
          kind: 'user',
          turn: message.turn,
          text: message.text ?? '',
          steer: true
        })
      };
    case 'waiting':
      return { ...state, waiting: message.line ?? null };
    case 'approval':
      return {
        ...state,
        items: appended(items, { kind: 'approval', turn: message.turn, text: message.text ?? '' })
      };
    case 'end':
      return {
        items: appended(items, {
          kind: 'end',
          turn: message.turn,
          text: message.line ?? '',
          status: message.status
        }),
        running: state.running === message.turn ? null : state.running,
        waiting: null
      };
  }
}

/**
 * The conversation as the transcript has it (after a page reload), or null if unreadable:
 * the server's `/soba/api/conversation` items (`soba_nb/server/conversation.py`) —
 * `{kind: "message", role, text, steer, edit?}`, `{kind: "tool", line, isError, images}`,
 * `{kind: "capsule", line}`.
 */
export function fromTranscript(data: unknown): IConversation | null {
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const messages = (data as Record<string, unknown>).messages;
  if (!Array.isArray(messages)) {
    return null;
  }
  const items: IItem[] = [];
  for (const raw of messages) {
    if (typeof raw !== 'object' || raw === null) {
      continue;
    }
    const fields = raw as Record<string, unknown>;
    const kind = str(fields.kind);
    const text = str(fields.text) ?? str(fields.line);
    const role = str(fields.role);
    if (text === undefined) {
      continue;
    }
    if (kind === 'message' && fields.edit) {
      items.push({ kind: 'notice', turn: '', text }); // an edit decision: what the model was told
    } else if (kind === 'message' && (role === 'user' || role === 'assistant')) {
      items.push({ kind: role, turn: '', text, steer: fields.steer === true });
    } else if (kind === 'tool') {
      const status = str(fields.status) ?? (fields.isError === true ? 'error' : 'ok');
      items.push({ kind: 'tool', turn: '', text, status, images: strings(fields.images) });
    } else {
      items.push({ kind: 'notice', turn: '', text });
    }
  }
  return {
    items: items.slice(Math.max(0, items.length - MAX_ITEMS)),
    running: null,
    waiting: null
  };
}
