/**
 * "Show dashboard": the run's live dashboard widget in a main-area tab, or the cell that holds its figure.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget, Notification } from '@jupyterlab/apputils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { OutputArea, OutputAreaModel } from '@jupyterlab/outputarea';

import { IDashboardMessage } from './protocol';

const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';

export function showDashboard(
  app: JupyterFrontEnd,
  panel: NotebookPanel,
  message: IDashboardMessage
): void {
  if (message.model_id) {
    openLiveView(app, panel, message.run, message.model_id);
  } else if (message.cell_id) {
    revealCell(app, panel, message.cell_id, message.run);
  } else if (message.message) {
    Notification.info(message.message, { autoClose: 5000 });
  }
}

/** A second view of the dashboard widget, rendered by the notebook's own widget manager. */
function openLiveView(
  app: JupyterFrontEnd,
  panel: NotebookPanel,
  run: number,
  modelId: string
): void {
  const model = new OutputAreaModel({ trusted: true });
  const area = new OutputArea({ model, rendermime: panel.content.rendermime });
  model.add({
    output_type: 'display_data',
    data: { [WIDGET_MIME]: { model_id: modelId, version_major: 2, version_minor: 0 } },
    metadata: {}
  });
  const view = new MainAreaWidget({ content: area });
  view.id = `nbdist-dashboard-${panel.id}-${run}`;
  view.title.label = `Dashboard: run ${run}`;
  view.addClass('jp-nbdist-dashboard-view');
  panel.disposed.connect(() => view.dispose());
  app.shell.add(view, 'main', { mode: 'split-right', ref: panel.id });
  app.shell.activateById(view.id);
}

/** Scroll the notebook to the run's cell (its output keeps the final figure). */
function revealCell(app: JupyterFrontEnd, panel: NotebookPanel, cellId: string, run: number): void {
  const notebook = panel.content;
  const index = notebook.widgets.findIndex(cell => cell.model.id === cellId);
  if (index < 0) {
    Notification.info(`The cell of run ${run} is no longer in this notebook.`, { autoClose: 5000 });
    return;
  }
  app.shell.activateById(panel.id);
  notebook.activeCellIndex = index;
  notebook.scrollToCell(notebook.widgets[index]).catch(reason => console.warn('nbdist: scroll failed', reason));
}
