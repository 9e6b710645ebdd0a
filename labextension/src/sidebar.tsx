/**
 * The "Distributed" left-sidebar panel: cluster, definition cells and runs of the active notebook's kernel.
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { ILink, NotebookLinks } from './links';
import { DistModel, runProgressText, runSeconds } from './model';
import { IEngine, INode, IRun, IStateMessage } from './protocol';

export class DistributedPanel extends ReactWidget {
  private _model: DistModel | null = null;

  constructor(private _links: NotebookLinks) {
    super();
    this.id = 'nbdist-sidebar';
    this.addClass('jp-nbdist-panel');
    this.title.caption = 'Distributed (nbdist)';
    _links.currentChanged.connect((_, link) => this._follow(link));
    this._follow(_links.current);
  }

  private _follow(link: ILink | null): void {
    this._model?.changed.disconnect(this.update, this);
    this._model = link?.model ?? null;
    this._model?.changed.connect(this.update, this);
    this.update();
  }

  protected render(): React.ReactElement {
    const link = this._links.current;
    return (
      <div className="jp-nbdist-body">
        <h2 className="jp-nbdist-title">Distributed</h2>
        {link ? <LinkView link={link} /> : <NoNotebook />}
      </div>
    );
  }
}

function NoNotebook(): React.ReactElement {
  return (
    <p className="jp-nbdist-empty">
      Open a notebook to see its cluster and training runs.
    </p>
  );
}

function LinkView({ link }: { link: ILink }): React.ReactElement {
  const { model } = link;
  const state = model.state;
  if (!model.loaded || !state) {
    return (
      <div className="jp-nbdist-empty">
        <p>nbdist is not loaded in this notebook's kernel. To begin, run:</p>
        <pre>%load_ext nbdist{'\n'}%dist start -n 2</pre>
        <p>
          then mark data and model cells with <code>%%distribute define</code>{' '}
          and train with <code>%%distribute --strategy local</code>.
        </p>
      </div>
    );
  }
  return (
    <>
      <ClusterView state={state} />
      <DefinitionsView state={state} />
      <RunsView state={state} link={link} />
      {model.notice ? (
        <p
          className={`jp-nbdist-notice ${model.notice.ok ? '' : 'jp-nbdist-notice-error'}`}
        >
          {model.notice.message}
        </p>
      ) : null}
    </>
  );
}

function ClusterView({ state }: { state: IStateMessage }): React.ReactElement {
  const cluster = state.cluster;
  if (!cluster) {
    return (
      <section className="jp-nbdist-cluster">
        <h3>Cluster</h3>
        <p className="jp-nbdist-empty">
          No cluster yet: run <code>%dist start -n 2</code> or{' '}
          <code>%dist connect --profile NAME</code>.
        </p>
      </section>
    );
  }
  return (
    <section className="jp-nbdist-cluster">
      <h3>
        Cluster · {cluster.engines.length} engine
        {cluster.engines.length === 1 ? '' : 's'}
        {cluster.owned ? '' : ' (connected)'}
      </h3>
      <table className="jp-nbdist-table">
        <thead>
          <tr>
            <th>engine</th>
            <th>host</th>
            <th>GPU</th>
            <th>state</th>
          </tr>
        </thead>
        <tbody>
          {cluster.engines.map(e => (
            <EngineRow key={e.id} engine={e} />
          ))}
        </tbody>
      </table>
    </section>
  );
}

function EngineRow({ engine }: { engine: IEngine }): React.ReactElement {
  return (
    <tr className="jp-nbdist-engine" data-engine-id={engine.id} data-state={engine.state}>
      <td>{engine.id}</td>
      <td>{engine.host}</td>
      <td>{engine.gpus.length ? engine.gpus.join(', ') : '-'}</td>
      <td className={`jp-nbdist-state-${engine.state}`}>{engine.state}</td>
    </tr>
  );
}

function DefinitionsView({ state }: { state: IStateMessage }): React.ReactElement {
  return (
    <section className="jp-nbdist-definitions">
      <h3>Definition cells · {state.definitions.length}</h3>
      {state.definitions.length ? (
        <ol>
          {state.definitions.map(d => (
            <li key={d.key} className="jp-nbdist-definition" title={d.key}>
              <code>{d.first_line || '(empty)'}</code> · {d.lines} line
              {d.lines === 1 ? '' : 's'}
            </li>
          ))}
        </ol>
      ) : (
        <p className="jp-nbdist-empty">
          None yet: start data and model cells with <code>%%distribute define</code>.
        </p>
      )}
    </section>
  );
}

function RunsView({ state, link }: { state: IStateMessage; link: ILink }): React.ReactElement {
  const runs = [...state.runs].reverse();
  return (
    <section className="jp-nbdist-runs">
      <h3>Runs · {runs.length}</h3>
      {runs.length ? (
        runs.map(run => (
          <RunView key={run.id} run={run} kernelTime={state.kernel_time} link={link} />
        ))
      ) : (
        <p className="jp-nbdist-empty">
          None yet: run a cell that starts with <code>%%distribute --strategy local</code>.
        </p>
      )}
    </section>
  );
}

function RunView(props: { run: IRun; kernelTime: number; link: ILink }): React.ReactElement {
  const { run, kernelTime, link } = props;
  const seconds = runSeconds(run, kernelTime);
  const final = Object.entries(run.final)
    .filter(([, v]) => v !== null)
    .map(([k, v]) => `${k} ${(v as number).toFixed(4)}`)
    .join(', ');
  return (
    <div className="jp-nbdist-run" data-run-id={run.id} data-status={run.status}>
      <div className="jp-nbdist-run-title">
        <b>run {run.id}</b> · {run.strategy} · {run.workers.length} worker
        {run.workers.length === 1 ? '' : 's'} ·{' '}
        <span className="jp-nbdist-run-status">{runProgressText(run)}</span>
        {seconds === null ? '' : ` · ${seconds.toFixed(0)} s`}
      </div>
      <progress className="jp-nbdist-progress" max={1} value={run.progress ?? 0} />
      {final ? <div className="jp-nbdist-final">{final}</div> : null}
      {run.error ? <div className="jp-nbdist-error">{run.error}</div> : null}
      {run.events.length ? (
        <ul className="jp-nbdist-events">
          {run.events.map((line, i) => (
            <li key={i}>{line}</li>
          ))}
        </ul>
      ) : null}
      <table className="jp-nbdist-table jp-nbdist-nodes">
        <tbody>
          {run.nodes.map(node => (
            <NodeRow key={node.rank} node={node} />
          ))}
        </tbody>
      </table>
      <div className="jp-nbdist-actions">
        {run.stoppable ? (
          <button
            className="jp-Button jp-mod-styled jp-mod-warn jp-nbdist-stop"
            onClick={() => link.channel?.stop(run.id)}
          >
            Stop
          </button>
        ) : null}
        <button
          className="jp-Button jp-mod-styled jp-mod-reject jp-nbdist-dashboard"
          onClick={() => link.channel?.showDashboard(run.id)}
        >
          Show dashboard
        </button>
      </div>
    </div>
  );
}

function NodeRow({ node }: { node: INode }): React.ReactElement {
  const r = node.record;
  const parts: string[] = [];
  if (r?.loss !== null && r?.loss !== undefined) {
    parts.push(`loss ${r.loss.toFixed(3)}`);
  }
  if (r?.samples_per_s) {
    parts.push(`${Math.round(r.samples_per_s)}/s`);
  }
  if (r?.staleness) {
    parts.push(`stale ${r.staleness}`);
  }
  return (
    <tr className="jp-nbdist-node" data-rank={node.rank}>
      <td title={`engine ${node.engine} on ${node.host ?? '?'}`}>
        w{node.rank}
      </td>
      <td>{parts.join(' · ') || 'waiting'}</td>
      <td>
        <Sparkline values={node.losses} />
      </td>
    </tr>
  );
}

/** A tiny loss chart: one polyline scaled to the values' range. */
function Sparkline({ values }: { values: number[] }): React.ReactElement | null {
  if (values.length < 2) {
    return null;
  }
  const w = 60;
  const h = 16;
  const lo = Math.min(...values);
  const span = Math.max(...values) - lo || 1;
  const points = values
    .map((v, i) => `${((i / (values.length - 1)) * w).toFixed(1)},${(h - ((v - lo) / span) * h).toFixed(1)}`)
    .join(' ');
  return (
    <svg className="jp-nbdist-spark" width={w} height={h} viewBox={`0 0 ${w} ${h}`}>
      <polyline points={points} fill="none" strokeWidth={1.2} />
    </svg>
  );
}
