// pi's side of benchmarks/resume_bench.py: one fresh Node process per run, like ours.
//
//   node --expose-gc pi_resume.mjs PACKAGE_DIR SESSION.jsonl VARIANT APPENDS.json BUDGET_S
//
// PACKAGE_DIR is node_modules/@earendil-works/pi-coding-agent; VARIANT is "plan" (time
// prepareCompaction, the summary input and appends), "requests" (time pi's check before
// each response while appending) or "resume" (nothing more: the whole process is timed from
// outside, and only the session manager is imported). Prints one JSON object: seconds and bytes.
//
// The calls are pi's own, as its agent session makes them (dist/core/agent-session.js):
// - resume: SessionManager.open(file), then sessionManager.buildSessionContext();
// - compaction plan: prepareCompaction(sessionManager.getBranch(), DEFAULT_COMPACTION_SETTINGS);
// - summary input: what generateSummaryWithUsage builds before calling the model,
//   `<conversation>\n${serializeConversation(convertToLlm(messagesToSummarize))}\n</conversation>`;
// - check before a response (_compactBeforeNextAssistantResponse): buildSessionProjection(),
//   then shouldCompact(estimateProjectedContextTokens(projection, getBranch()).tokens, ...);
// - append: appendMessage / appendUsage.
// Only pi's session and compaction modules are imported (not its terminal UI), as our side
// imports only soba-nb's session: both peak RSS figures are the session machinery and its data.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [packageDir, file, variant, appendsFile, budgetArg] = process.argv.slice(2);
const budget = Number(budgetArg);
const CONTEXT_WINDOW = 128000; // gpt-4o, as on our side
const BEST_OF = 5;

const core = (name) => import(pathToFileURL(join(packageDir, "dist", "core", name)).href);
const { SessionManager } = await core("session-manager.js");
const resumeOnly = variant === "resume";
const compaction = resumeOnly ? null : await core("compaction/compaction.js");
const { serializeConversation } = resumeOnly ? {} : await core("compaction/utils.js");
const { convertToLlm } = resumeOnly ? {} : await core("messages.js");
const appends = resumeOnly ? [] : JSON.parse(readFileSync(appendsFile, "utf8"));

// VmHWM, as on our side (resume_bench._max_rss): maxRSS from getrusage would include the
// RSS of the Python process that spawned this one.
function maxRss() {
  try {
    const match = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync("/proc/self/status", "ascii"));
    if (match) return Number(match[1]) * 1024;
  } catch {
    // no /proc: fall back to getrusage
  }
  return process.resourceUsage().maxRSS * 1024;
}
const seconds = (start) => (performance.now() - start) / 1000;

function bestOf(fn) {
  // The fastest of up to BEST_OF runs, each from a collected heap, within the time budget.
  let best = Infinity;
  let value;
  const started = performance.now();
  for (let run = 0; run < BEST_OF; run++) {
    globalThis.gc?.();
    const start = performance.now();
    value = fn();
    best = Math.min(best, seconds(start));
    if (seconds(started) > budget) break;
  }
  return [best, value];
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

function append(manager, item) {
  const start = performance.now();
  if (item.usage) manager.appendUsage(item.kind, item.provider, item.model, item.usage);
  else manager.appendMessage(item.message);
  return seconds(start);
}

const rssImports = maxRss();
globalThis.gc?.();
let start = performance.now();
const manager = SessionManager.open(file);
const open = seconds(start);
start = performance.now();
const context = manager.buildSessionContext();
const buildContext = seconds(start);
const result = { open, context: buildContext, rss: maxRss(), rssImports, messages: context.messages.length };

if (variant === "plan") {
  const settings = compaction.DEFAULT_COMPACTION_SETTINGS;
  const [plan, preparation] = bestOf(() => compaction.prepareCompaction(manager.getBranch(), settings));
  result.plan = plan;
  if (preparation) {
    const [summary, text] = bestOf(
      () => `<conversation>\n${serializeConversation(convertToLlm(preparation.messagesToSummarize))}\n</conversation>\n\n`,
    );
    result.summary = summary;
    result.summaryChars = text.length;
    result.summarized = preparation.messagesToSummarize.length;
  }
  result.append = median(appends.map((item) => append(manager, item)));
} else if (variant === "requests") {
  const settings = compaction.DEFAULT_COMPACTION_SETTINGS;
  const appended = [];
  const checks = [];
  for (const item of appends) {
    appended.push(append(manager, item));
    if (!item.beforeResponse) continue;
    globalThis.gc?.();
    const begin = performance.now();
    const projection = manager.buildSessionProjection();
    const tokens = compaction.estimateProjectedContextTokens(projection, manager.getBranch()).tokens;
    compaction.shouldCompact(tokens, CONTEXT_WINDOW, settings);
    checks.push(seconds(begin));
  }
  result.request = median(checks);
  result.append = median(appended);
}
process.stdout.write(`${JSON.stringify(result)}\n`);
