import { DistModel, runProgressText, runSeconds } from '../model';
import { parseMessage } from '../protocol';
import { run, state } from './fixtures';

describe('parseMessage', () => {
  it('accepts the four kernel message types', () => {
    expect(parseMessage(state())?.type).toBe('state');
    expect(parseMessage({ type: 'hello', schema: 1 })?.type).toBe('hello');
    expect(parseMessage({ type: 'ack', action: 'stop', run: 1, ok: true, message: '' })?.type).toBe('ack');
    expect(parseMessage({ type: 'dashboard', run: 1, model_id: 'm', cell_id: null, message: '' })?.type).toBe(
      'dashboard'
    );
  });

  it('refuses malformed messages and other schema versions', () => {
    for (const bad of [null, 3, 'state', [], {}, { type: 'nope' }, { type: 'hello', schema: 2 },
      { ...state(), schema: 2 }, { ...state(), runs: 'x' }, { ...state(), cluster: 'x' },
      { type: 'ack', ok: 'yes' }, { type: 'dashboard', run: '1' }]) {
      expect(parseMessage(bad)).toBeNull();
    }
  });

  it('fills fields an older kernel may not send', () => {
    const { strategies, kernel_time, ...old } = state();
    const parsed = parseMessage(old);
    expect(parsed).not.toBeNull();
    expect((parsed as any).strategies).toEqual([]);
    expect(typeof (parsed as any).kernel_time).toBe('number');
  });
});

describe('DistModel', () => {
  it('starts unloaded with no status text', () => {
    const model = new DistModel();
    expect(model.loaded).toBe(false);
    expect(model.statusText()).toBe('');
    expect(model.strategies).toContain('ddc-asgd');
  });

  it('is loaded by a hello and says when there is no cluster', () => {
    const model = new DistModel();
    model.handle({ type: 'hello', schema: 1 });
    expect(model.loaded).toBe(true);
    expect(model.statusText()).toBe('nbdist: no cluster');
    model.handle(state({ cluster: null, runs: [] }));
    expect(model.statusText()).toBe('nbdist: no cluster');
  });

  it('counts live engines and shows the running run with its progress', () => {
    const model = new DistModel();
    let changes = 0;
    model.changed.connect(() => changes++);
    expect(model.handle(state())).toBe(true);
    expect(changes).toBe(1);
    expect(model.engineCount).toBe(2); // the dead engine is not counted
    expect(model.statusText()).toBe('nbdist: 2 engines · nfdt 37%');
    expect(model.strategies).toEqual(['local', 'nfdt', 'ddc-asgd']);
  });

  it('prefers the newest running run, else the newest run', () => {
    const model = new DistModel();
    model.handle(state({ runs: [run({ id: 1 }), run({ id: 2, status: 'done', progress: 1, strategy: 'local' })] }));
    expect(model.currentRun?.id).toBe(1);
    model.handle(state({ runs: [run({ id: 1, status: 'failed' }), run({ id: 2, status: 'done', strategy: 'local' })] }));
    expect(model.currentRun?.id).toBe(2);
    expect(model.statusText()).toBe('nbdist: 2 engines · local done');
  });

  it('ignores malformed messages without a change', () => {
    const model = new DistModel();
    let changes = 0;
    model.changed.connect(() => changes++);
    expect(model.handle({ type: 'state', schema: 1 })).toBe(false);
    expect(changes).toBe(0);
    expect(model.loaded).toBe(false);
  });

  it('keeps the last acknowledgement and forgets everything on reset', () => {
    const model = new DistModel();
    model.handle(state());
    model.handle({ type: 'ack', action: 'stop', run: 1, ok: true, message: 'run 1: stopping' });
    expect(model.notice?.message).toBe('run 1: stopping');
    model.reset();
    expect(model.loaded).toBe(false);
    expect(model.state).toBeNull();
    expect(model.notice).toBeNull();
  });

  it('hands dashboard answers on, and a reason to show when there is no dashboard', () => {
    const model = new DistModel();
    const asked: unknown[] = [];
    model.dashboardRequested.connect((_, m) => asked.push(m));
    model.handle({ type: 'dashboard', run: 3, model_id: 'abc', cell_id: 'c', message: '' });
    expect(asked).toHaveLength(1);
    expect(model.notice).toBeNull();
    model.handle({ type: 'dashboard', run: 4, model_id: null, cell_id: null, message: 'no dashboard' });
    expect(model.notice).toMatchObject({ ok: false, message: 'no dashboard' });
  });
});

describe('run helpers', () => {
  it('words progress and status', () => {
    expect(runProgressText(run({ progress: 0.999 }))).toBe('99%');
    expect(runProgressText(run({ progress: null }))).toBe('starting');
    expect(runProgressText(run({ status: 'interrupted' }))).toBe('interrupted');
  });

  it('measures running runs by the kernel clock and ended runs by their end', () => {
    expect(runSeconds(run(), 130)).toBe(30);
    expect(runSeconds(run({ ended_at: 105 }), 130)).toBe(5);
    expect(runSeconds(run({ started_at: null }), 130)).toBeNull();
  });
});
