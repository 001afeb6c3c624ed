/**
 * soba-nb-labextension: the "soba" panel in JupyterLab's right sidebar — the conversation
 * with soba (SPEC §18: prompt box, queue, steer, approvals) above the context budget (SPEC §9)
 * — its status-bar item, the cells the agent proposes inserted below the running cell
 * (SPEC §10), the Fix button on failed cells and the cell edits the agent proposes
 * (`edit_cell`, SPEC §18), and `.capsule.md` files opened as Markdown with their own icon.
 *
 * The budget store opens a comm to every notebook's kernel whose cells use soba, wherever
 * the extension loads; the panel is added to JupyterLab's right sidebar (`ILabShell`) and to
 * Notebook 7's right panel (its notebook page has one, opened from View > Right Sidebar or
 * with Ctrl/Cmd+Alt+S), the status-bar item where there is a status bar. Where no panel can
 * go, `%budget` renders inline and the comm still carries the proposed cells and edits
 * (`cells.ts`, `edits.ts`: they need nothing but the notebook tracker).
 */

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IStatusBar } from '@jupyterlab/statusbar';

import { capsuleFiles } from './capsule';
import { ChatController } from './chat';
import { proposedCells } from './cells';
import { budgetIcon } from './icon';
import { FixButtons } from './fix';
import { cellEdits } from './edits';
import { BudgetPanel } from './panel';
import { BudgetStatus, STATUS_ITEM_ID } from './statusbar';
import { BudgetStore } from './store';

const SHOW_BUDGET = 'soba:show-budget';
const ASK = 'soba:ask';
const SIDEBAR_RANK = 600;
const STATUS_RANK = 50;

/** Notebook 7's shell (`INotebookShell`): a right panel, opened by id. */
interface IRightPanelShell {
  expandRight(id?: string): void;
}

function rightPanelShell(shell: JupyterFrontEnd.IShell): IRightPanelShell | null {
  const candidate = shell as unknown as Partial<IRightPanelShell>;
  return typeof candidate.expandRight === 'function' ? (candidate as IRightPanelShell) : null;
}

const budget: JupyterFrontEndPlugin<void> = {
  id: 'soba-nb-labextension:plugin',
  description: 'The soba-nb context budget of the current notebook, in the right sidebar.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILabShell, ICommandPalette, ILayoutRestorer, IStatusBar, IRenderMimeRegistry],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    labShell: ILabShell | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null,
    rendermime: IRenderMimeRegistry | null
  ): void => {
    const store = new BudgetStore();
    const chat = new ChatController(store);
    const follow = (notebook: NotebookPanel) => {
      store.track(notebook);
      chat.follow(notebook);
      fixButtons.follow(notebook);
    };
    let show = (): void => undefined;
    const fixButtons = new FixButtons((notebook, count) => {
      show();
      void chat.fix(notebook, count);
    });
    tracker.forEach(follow);
    tracker.widgetAdded.connect((_, notebook) => follow(notebook));
    // JupyterLab's right sidebar; Notebook 7's right panel (its shell has one on the
    // notebook page, opened from View > Right Sidebar); elsewhere the magics remain.
    const notebookShell = labShell ? null : rightPanelShell(app.shell);
    if (!labShell && !notebookShell) {
      return;
    }

    const panel = new BudgetPanel(store, chat, rendermime);
    panel.title.icon = budgetIcon;
    panel.title.label = labShell ? '' : 'soba';
    app.shell.add(panel, 'right', { rank: SIDEBAR_RANK });
    show = () => {
      notebookShell?.expandRight(panel.id);
      app.shell.activateById(panel.id);
    };
    // Reopen the panel after a reload if it was open.
    restorer?.add(panel, panel.id);
    panel.showNotebook(tracker.currentWidget);
    tracker.currentChanged.connect((_, notebook) => panel.showNotebook(notebook));

    app.commands.addCommand(SHOW_BUDGET, {
      label: 'soba: show budget',
      caption: 'Show the context budget of the current notebook in the right sidebar',
      icon: budgetIcon,
      execute: show
    });
    palette?.addItem({ command: SHOW_BUDGET, category: 'soba' });
    app.commands.addCommand(ASK, {
      label: 'soba: ask in the sidebar',
      caption: 'Open the soba sidebar and put the cursor in its prompt box',
      icon: budgetIcon,
      execute: () => {
        show();
        panel.focusPrompt();
      }
    });
    app.commands.addKeyBinding({ command: ASK, keys: ['Accel Alt S'], selector: 'body' });
    palette?.addItem({ command: ASK, category: 'soba' });

    if (statusBar) {
      const item = new BudgetStatus(store, tracker, show);
      statusBar.registerStatusItem(STATUS_ITEM_ID, {
        item,
        align: 'left',
        rank: STATUS_RANK,
        isActive: () => item.shown,
        activeStateChanged: item.activeChanged
      });
    }
  }
};

export default [budget, proposedCells, cellEdits, capsuleFiles];
