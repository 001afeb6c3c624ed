/**
 * A line diff of a cell's source and the source the agent proposes (`edit_cell`, SPEC §18):
 * the longest common subsequence of lines, as kept (` `), removed (`-`) and added (`+`) lines.
 * Cells are short; past `MAX_CELLS` line pairs the diff is the old lines removed and the new
 * added (still exact, only less compact).
 */

export interface IDiffLine {
  op: ' ' | '-' | '+';
  text: string;
}

const MAX_CELLS = 250_000;

export function lineDiff(before: string, after: string): IDiffLine[] {
  const a = before.split('\n');
  const b = after.split('\n');
  if (a.length * b.length > MAX_CELLS) {
    return [
      ...a.map(text => ({ op: '-' as const, text })),
      ...b.map(text => ({ op: '+' as const, text }))
    ];
  }
  // lengths[i][j]: the longest common subsequence of a[i:] and b[j:].
  const lengths = Array.from({ length: a.length + 1 }, () => new Array<number>(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      lengths[i][j] =
        a[i] === b[j] ? lengths[i + 1][j + 1] + 1 : Math.max(lengths[i + 1][j], lengths[i][j + 1]);
    }
  }
  const lines: IDiffLine[] = [];
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) {
    if (a[i] === b[j]) {
      lines.push({ op: ' ', text: a[i] });
      i++;
      j++;
    } else if (lengths[i + 1][j] >= lengths[i][j + 1]) {
      lines.push({ op: '-', text: a[i++] });
    } else {
      lines.push({ op: '+', text: b[j++] });
    }
  }
  while (i < a.length) {
    lines.push({ op: '-', text: a[i++] });
  }
  while (j < b.length) {
    lines.push({ op: '+', text: b[j++] });
  }
  return lines;
}
