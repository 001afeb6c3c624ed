/**
 * soba-nb-labextension: the "soba budget" panel in JupyterLab's right sidebar (SPEC §9),
 * its status-bar item, the cells the agent proposes inserted below the running cell
 * (SPEC §10), and `.capsule.md` files opened as Markdown with their own icon.
 *
 * The budget store opens a comm to every notebook's kernel whose cells use soba, wherever
 * the extension loads; the panel itself is added only in JupyterLab (`ILabShell`), the
 * status-bar item where there is a status bar. Notebook 7 loads the same extensions but has
 * no such panel: there `%budget` renders inline, and the comm carries the proposed cells
 * (`cells.ts`, which needs nothing but the notebook tracker).
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
import { BudgetPanel, PANEL_ID } from './panel';
import { BudgetStatus, STATUS_ITEM_ID } from './statusbar';
import { BudgetStore } from './store';

const SHOW_BUDGET = 'soba:show-budget';
const ASK = 'soba:ask';
const SIDEBAR_RANK = 600;
const STATUS_RANK = 50;

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
    const fixButtons = new FixButtons((notebook, count) => {
      if (labShell) {
        labShell.activateById(PANEL_ID);
      }
      void chat.fix(notebook, count);
    });
    tracker.forEach(follow);
    tracker.widgetAdded.connect((_, notebook) => follow(notebook));
    if (!labShell) {
      return;
    }

    const panel = new BudgetPanel(store, chat, rendermime);
    panel.title.icon = budgetIcon;
    labShell.add(panel, 'right', { rank: SIDEBAR_RANK });
    // Reopen the panel after a reload if it was open.
    restorer?.add(panel, panel.id);
    panel.showNotebook(tracker.currentWidget);
    tracker.currentChanged.connect((_, notebook) => panel.showNotebook(notebook));

    app.commands.addCommand(SHOW_BUDGET, {
      label: 'soba: show budget',
      caption: 'Show the context budget of the current notebook in the right sidebar',
      icon: budgetIcon,
      execute: () => labShell.activateById(panel.id)
    });
    palette?.addItem({ command: SHOW_BUDGET, category: 'soba' });
    app.commands.addCommand(ASK, {
      label: 'soba: ask in the sidebar',
      caption: 'Open the soba sidebar and put the cursor in its prompt box',
      icon: budgetIcon,
      execute: () => {
        labShell.activateById(panel.id);
        panel.focusPrompt();
      }
    });
    app.commands.addKeyBinding({ command: ASK, keys: ['Accel Alt S'], selector: 'body' });
    palette?.addItem({ command: ASK, category: 'soba' });

    if (statusBar) {
      const item = new BudgetStatus(store, tracker, () => labShell.activateById(panel.id));
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
