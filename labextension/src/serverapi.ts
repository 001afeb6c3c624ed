/**
 * The soba server extension's routes (`soba_nb/server/`): what the sidebar sends through the
 * Jupyter server rather than the kernel, because a busy kernel does not read its shell
 * channel while a cell runs (SPEC §18): steering a running turn, answering a cell edit, the
 * queue of requests waiting for the turn to end, and the conversation read back from the
 * transcript after a page reload. `path` is the notebook's path as the contents API names it.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

const API = 'soba/api';

/** A queued request. */
export interface IQueueItem {
  id: string;
  text: string;
}

/** A message for the running turn's kernel (design: `<stem>.soba/inbox/`). */
export type InboxMessage =
  | { kind: 'steer'; text: string }
  | {
      kind: 'edit';
      call: string;
      executionCount: number | null;
      decision: 'accepted' | 'rejected';
    };

/** The server's one-line refusal, or what went wrong on the way. */
export class ServerApiError extends Error {}

async function call(
  route: string,
  init: RequestInit = {},
  query: Record<string, string> = {}
): Promise<unknown> {
  const settings = ServerConnection.makeSettings();
  const search = new URLSearchParams(query).toString();
  const url = URLExt.join(settings.baseUrl, API, route) + (search ? `?${search}` : '');
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (reason) {
    throw new ServerApiError(`the Jupyter server did not answer: ${String(reason)}`);
  }
  const text = await response.text();
  let data: unknown = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const said =
      typeof data === 'object' && data !== null && 'message' in data
        ? String((data as { message: unknown }).message)
        : '';
    if (response.status === 404 && !said) {
      throw new ServerApiError(
        'the soba server extension is not enabled here (jupyter server extension enable soba_nb)'
      );
    }
    throw new ServerApiError(said || `the server answered ${response.status}`);
  }
  return data;
}

const post = (route: string, body: object): RequestInit => ({
  method: 'POST',
  body: JSON.stringify(body)
});

/** Deliver a message to the kernel of the notebook at `path`, running or not. */
export async function sendToInbox(path: string, message: InboxMessage): Promise<void> {
  await call('inbox', post('inbox', { path, message }));
}

function items(data: unknown): IQueueItem[] {
  const raw = (data as { items?: unknown } | null)?.items;
  return Array.isArray(raw)
    ? raw.filter(
        (item): item is IQueueItem =>
          typeof item?.id === 'string' && typeof item?.text === 'string'
      )
    : [];
}

export async function listQueue(path: string): Promise<IQueueItem[]> {
  return items(await call('queue', {}, { path }));
}

export async function addToQueue(path: string, text: string): Promise<void> {
  await call('queue', post('queue', { path, text }));
}

export async function editQueued(path: string, id: string, text: string): Promise<void> {
  await call('queue', { method: 'PUT', body: JSON.stringify({ path, id, text }) });
}

export async function removeQueued(path: string, id: string): Promise<void> {
  await call('queue', { method: 'DELETE' }, { path, id });
}

/** The first queued request, taken off the queue (null when it is empty). */
export async function takeNext(path: string): Promise<IQueueItem | null> {
  const data = (await call('queue/next', post('queue/next', { path }))) as {
    item?: unknown;
  } | null;
  const [item] = items({ items: data?.item ? [data.item] : [] });
  return item ?? null;
}

/** The notebook's conversation as its latest transcript holds it (the server's JSON). */
export async function conversationOf(path: string): Promise<unknown> {
  return call('conversation', {}, { path });
}
