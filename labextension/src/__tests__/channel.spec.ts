import { KernelChannel } from '../channel';
import { DistModel } from '../model';
import { COMM_TARGET } from '../protocol';
import { FakeKernel, state } from './fixtures';

function setUp() {
  const kernel = new FakeKernel();
  const model = new DistModel();
  const channel = new KernelChannel(kernel as any, model);
  return { kernel, model, channel };
}

describe('KernelChannel', () => {
  it('registers the nbdist comm target on the kernel', () => {
    const { kernel } = setUp();
    expect(kernel.targets.has(COMM_TARGET)).toBe(true);
  });

  it('opens no comm when nbdist is not loaded in the kernel', async () => {
    const { kernel, model, channel } = setUp();
    await channel.probe();
    expect(kernel.created).toHaveLength(0);
    expect(channel.connected).toBe(false);
    expect(model.loaded).toBe(false);
  });

  it('accepts the comm the kernel opens on %load_ext and asks for the state', () => {
    const { kernel, model, channel } = setUp();
    const comm = kernel.openFromKernel(COMM_TARGET, { type: 'hello', schema: 1 });
    expect(channel.connected).toBe(true);
    expect(model.loaded).toBe(true);
    expect(comm.sent).toEqual([{ action: 'request_state' }]);
    comm.receive(state());
    expect(model.statusText()).toBe('nbdist: 2 engines · nfdt 37%');
  });

  it('opens its own comm to a kernel that already has nbdist loaded (a page reload)', async () => {
    const { kernel, model, channel } = setUp();
    kernel.comms = { 'kernel-0': { target_name: COMM_TARGET } };
    await Promise.all([channel.probe(), channel.probe()]);
    expect(kernel.created).toHaveLength(1); // concurrent probes share one request
    expect(kernel.created[0].opened).toEqual([{ action: 'request_state' }]);
    kernel.created[0].receive(state());
    expect(model.state?.runs[0].id).toBe(1);
    await channel.probe();
    expect(kernel.created).toHaveLength(1); // already connected
  });

  it('sends stop and show_dashboard actions on the comm', () => {
    const { kernel, channel } = setUp();
    expect(channel.stop(1)).toBe(false); // no comm yet
    const comm = kernel.openFromKernel(COMM_TARGET, { type: 'hello', schema: 1 });
    expect(channel.stop(1)).toBe(true);
    expect(channel.showDashboard(2)).toBe(true);
    expect(comm.sent.slice(1)).toEqual([
      { action: 'stop', run: 1 },
      { action: 'show_dashboard', run: 2 }
    ]);
  });

  it('drops malformed kernel messages', () => {
    const { kernel, model } = setUp();
    const comm = kernel.openFromKernel(COMM_TARGET, { type: 'hello', schema: 1 });
    comm.receive(state());
    comm.receive({ type: 'state', schema: 99 });
    expect(model.state?.schema).toBe(1);
  });

  it('resets the model when the kernel closes the comm or restarts, and probes again on reconnect', async () => {
    const { kernel, model, channel } = setUp();
    let comm = kernel.openFromKernel(COMM_TARGET, { type: 'hello', schema: 1 });
    comm.receive(state());
    comm.closeFromKernel(); // %unload_ext nbdist
    expect(model.loaded).toBe(false);
    expect(channel.connected).toBe(false);

    comm = kernel.openFromKernel(COMM_TARGET, { type: 'hello', schema: 1 });
    comm.receive(state());
    kernel.statusChanged.emit('restarting');
    expect(model.state).toBeNull();
    expect(channel.connected).toBe(false);

    kernel.comms = { 'kernel-1': { target_name: COMM_TARGET } };
    kernel.connectionStatusChanged.emit('connected');
    await channel.probe();
    expect(kernel.created).toHaveLength(1);
  });

  it('removes its target when disposed', () => {
    const { kernel, channel } = setUp();
    channel.dispose();
    channel.dispose();
    expect(kernel.targets.has(COMM_TARGET)).toBe(false);
  });
});

describe('KernelChannel theme', () => {
  afterEach(() => {
    (KernelChannel as any)._dark = null;
    (KernelChannel as any)._open.clear();
  });

  it('tells connected kernels and those that connect later whether the theme is dark', () => {
    const { kernel } = setUp();
    const comm = kernel.openFromKernel(COMM_TARGET, { type: 'hello', schema: 1 });
    KernelChannel.setTheme(true);
    expect(comm.sent).toEqual([{ action: 'request_state' }, { action: 'theme', dark: true }]);
    const later = setUp();
    const laterComm = later.kernel.openFromKernel(COMM_TARGET, { type: 'hello', schema: 1 });
    expect(laterComm.sent).toEqual([{ action: 'request_state' }, { action: 'theme', dark: true }]);
    KernelChannel.setTheme(false);
    expect(laterComm.sent[2]).toEqual({ action: 'theme', dark: false });
  });

  it('sends nothing about the theme to a disposed channel', () => {
    const { kernel, channel } = setUp();
    const comm = kernel.openFromKernel(COMM_TARGET, { type: 'hello', schema: 1 });
    channel.dispose();
    KernelChannel.setTheme(true);
    expect(comm.sent).toEqual([{ action: 'request_state' }]);
  });
});
