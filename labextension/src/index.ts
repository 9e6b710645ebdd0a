/**
 * nbdist for JupyterLab 4: the Distributed sidebar, the status-bar item and two cell commands.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, IThemeManager } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { KernelChannel } from './channel';
import { addCommands } from './commands';
import { showDashboard } from './dashboard';
import { NotebookLinks } from './links';
import { DistributedPanel } from './sidebar';
import { DistStatus } from './status';

const clusterIcon = new LabIcon({
  name: 'nbdist:cluster',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<circle cx="12" cy="5" r="3"/><circle cx="5" cy="19" r="3"/><circle cx="19" cy="19" r="3"/>' +
    '<path d="M11 8h2v4.3l5.2 4-1.2 1.6-5-3.8-5 3.8-1.2-1.6 5.2-4z"/></g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nbdist:plugin',
  description: 'Distributed training sidebar, status item and cell commands for nbdist',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette, IThemeManager],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    themes: IThemeManager | null
  ) => {
    if (themes) {
      // the kernel's dashboards draw their plots in the theme's colours
      const follow = () => {
        if (themes.theme) {
          KernelChannel.setTheme(!themes.isLight(themes.theme));
        }
      };
      themes.themeChanged.connect(follow);
      follow();
    }
    const links = new NotebookLinks(tracker);

    const panel = new DistributedPanel(links);
    panel.title.icon = clusterIcon;
    app.shell.add(panel, 'left', { rank: 650 });

    if (statusBar) {
      const item = new DistStatus(links);
      statusBar.registerStatusItem('nbdist:status', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => item.active,
        activeStateChanged: item.activeStateChanged
      });
    }

    addCommands(app, tracker, links, palette);

    // The kernel's answer to "Show dashboard" arrives on the model of the notebook that asked.
    const wired = new WeakSet<object>();
    const wire = () => {
      const link = links.current;
      if (link && !wired.has(link.model)) {
        wired.add(link.model);
        link.model.dashboardRequested.connect((_, message) =>
          showDashboard(app, link.panel, message)
        );
      }
    };
    links.currentChanged.connect(wire);
    wire();
  }
};

export default plugin;
