"""A Session: the cluster handle, the recorded definition cells and the runs of one kernel."""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass

from . import bring
from ..cluster import lifeline
from ..host import namespace
from . import run as runs
from ..cluster.cluster import ClusterHandle
from ..errors import (KILLED_FROM_OUTSIDE, ClusterError, DefinitionFailed, EngineDied, NbdistError, NoFitCall,
                      OptionError)
from ..keras_semantics.keras_bridge import intercept_fit
from ..limits import LIMITS
from .results import install_result
from ..strategies import make_strategy


@dataclass
class Definition:
    key: str
    source: str
    index: int

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


class Session:
    """Everything nbdist knows in one kernel; the magics only parse and call into this."""

    def __init__(self, shell=None):
        self.shell = shell
        self.cluster: ClusterHandle | None = None
        self.definitions: dict[str, Definition] = {}
        self.runs: list[runs.Run] = []
        self.last_plan = None  # the last `--strategy auto` plan (`nbdist.planner.plan.Plan`), for `%dist plan`
        self.current_cell_id: str | None = None  # set by a pre_run_cell hook in a notebook
        self.listeners: list = []  # callables told what changed ("cluster", "definitions", "run", "progress")
        self.cell_hook = None  # the pre_run_cell hook that keeps `current_cell_id` (set by %load_ext)
        self.random_before: dict[int, dict] = {}  # each cell's (In[n]) random state before it ran (the same hook)
        self.lab = None  # the JupyterLab sidebar's channel, in a Jupyter kernel
        self.theme = "light"  # JupyterLab's theme as its extension reports it ("light" or "dark")
        self._transformed: dict[str, str] = {}  # cell text -> its Python (IPython's transform, cached)

    def changed(self, what: str) -> None:
        """Tell the listeners (the JupyterLab sidebar's channel) that part of the state changed."""
        for listener in list(self.listeners):
            listener(what)

    @property
    def last_run(self) -> runs.Run | None:
        return self.runs[-1] if self.runs else None

    # -- cluster -------------------------------------------------------------------------
    def start(self, n: int, engines: str = "local", profile: str | None = None,
              threads: int | str | None = None) -> ClusterHandle:
        """`%dist start`; `threads`: each engine's TensorFlow threads (None: its share of its host's cores)."""
        self.stop()
        self.cluster = ClusterHandle.start(n, engines, profile, threads=threads)
        self.cluster.refresh()
        self.changed("cluster")
        return self.cluster

    def add(self, n: int) -> list[int]:
        """`%dist add -n K`: K more engines on the cluster nbdist started; a running run may take them in."""
        added = self.require_cluster().add(n)
        self.changed("cluster")
        return added

    def connect(self, threads: int | str | None = None, **where) -> ClusterHandle:
        """`%dist connect`; `threads` as in `start`, for engines whose TensorFlow has not started yet."""
        self.stop()
        self.cluster = ClusterHandle.connect(**where, threads=threads)
        self.cluster.refresh()
        self.changed("cluster")
        return self.cluster

    def cap(self, memory: str, targets: str | None = None) -> str:
        """`%dist cap --memory SIZE [--targets IDS]`: the engines as hosts with SIZE of memory; says which."""
        from ..cluster.memory_caps import parse_size

        nbytes = parse_size(memory)
        ids = [int(t) for t in targets.split(",") if t.strip()] if targets else None
        capped = self.require_cluster().cap_memory(nbytes, ids)
        if nbytes is None:
            return "memory cap lifted"
        return f"engine(s) {capped} capped at {nbytes / (1 << 20):,.0f} MB each (what they allocate from now on)"

    def stop(self) -> str:
        """Stop the cluster if nbdist started it, else disconnect; says which."""
        if self.cluster is None:
            return "no cluster to stop"
        cluster, self.cluster = self.cluster, None
        owned = cluster.owned
        cluster.stop()
        self.changed("cluster")
        return "cluster stopped" if owned else "disconnected (the cluster was started outside nbdist and keeps running)"

    def stale_notice(self) -> str:
        """What to say about clusters previous kernels of this notebook started and left running ("" if none)."""
        return lifeline.describe_stale(lifeline.stale_clusters())

    def stop_stale(self) -> str:
        """Stop the clusters previous kernels of this notebook left running (not this kernel's); says which."""
        stopped = lifeline.stop_stale(lifeline.stale_clusters())
        if not stopped:
            return "no cluster of a previous kernel of this notebook is running"
        return f"stopped {len(stopped)} cluster(s) a previous kernel left running: {', '.join(stopped)}"

    def require_cluster(self) -> ClusterHandle:
        if self.cluster is None or self.cluster.client is None:
            raise ClusterError("no cluster yet: run %dist start -n 2 (local engines) or %dist connect --profile NAME")
        return self.cluster

    # -- definition cells ----------------------------------------------------------------
    def record_definition(self, source: str, name: str | None = None) -> Definition:
        """Remember a definition cell; one seen before (same name or cell id, else same text) is replaced in place."""
        key = name or "text:" + hashlib.sha256(source.encode()).hexdigest()[:16]
        old = self.definitions.get(key)
        definition = Definition(key, source, old.index if old else len(self.definitions) + 1)
        self.definitions[key] = definition
        self.changed("definitions")
        return definition

    def sync_definitions(self, engine_ids: list[int], empty_weights: bool = False) -> None:
        """Give the engines the notebook's Keras settings (`keras_globals`: a mixed-precision policy a plain cell
        set), then replay, in order, every definition an engine lacks or has in an older text; with
        `empty_weights`, its layers' weights made without values (`keras_semantics.empty_weights`)."""
        from ..keras_semantics import keras_globals

        cluster = self.require_cluster()
        if self.shell is not None:
            settings = keras_globals.current()
            calls = {eid: cluster.client[eid].apply_async(keras_globals.apply, settings) for eid in engine_ids}
            for eid, ar in calls.items():
                self._raise_sync_error(cluster, eid, ar)
        if not self.definitions:
            return
        have = {eid: cluster.client[eid].apply_async(namespace.definition_digests) for eid in engine_ids}
        have = {eid: ar.get(timeout=LIMITS.definition_s) for eid, ar in have.items()}
        for definition in sorted(self.definitions.values(), key=lambda d: d.index):
            targets = [eid for eid in engine_ids if have[eid].get(definition.key) != definition.digest]
            calls = {eid: cluster.client[eid].apply_async(
                namespace.run_definition, definition.key, definition.digest, definition.source, definition.index,
                empty_weights=empty_weights) for eid in targets}
            for eid, ar in calls.items():
                self._raise_definition_error(cluster, eid, ar, definition)

    def models_used(self, cell: str) -> dict:
        """{name: model} of the notebook's Keras models the cell uses."""
        from ..model_parts import model_sync

        python = self.shell.transform_cell(cell) if self.shell is not None else cell
        return model_sync.models_used(python, self.shell.user_ns) if self.shell is not None else {}

    def _strategy_for(self, cell: str, options: dict):
        """The run's strategy; a model whose weights stayed on the engines trains on under `pipeline` only (where
        they are)."""
        from ..model_parts.kept_weights import kept_of
        from ..planner.own_runs import refuse_auto_only

        refuse_auto_only(options)
        strategy = make_strategy(options)
        for name, model in self.models_used(cell).items():
            kept = kept_of(model)
            if kept is not None and strategy.name != "pipeline":
                raise OptionError(f"the weights of {name!r} stay on engines {list(kept['engines'])} (--keep-weights "
                                  f"engines): --strategy {strategy.name} needs them in the notebook. Run the cell under "
                                  f"--strategy pipeline, or write them with {name}.save_weights('{name}.weights.h5') "
                                  f"and read them with {name}.load_weights('{name}.weights.json') first.")
        return strategy

    def sync_models(self, cell: str, engine_ids: list[int], values: bool = True, states: dict | None = None) -> dict:
        """Give the engines the notebook's state of every Keras model the cell uses (see `model_sync`);
        returns the bytes sent, {"model_bytes": n, "models": {name: [engine ids]}}. Without `values` (a
        model-parallel run, whose engines fetch their own parts) an engine gets the model's settings, or
        its skeleton where it has no copy. `states`: the models' `ModelState`s, where the caller has them."""
        import pickle

        from ..model_parts import model_sync

        used = self.models_used(cell)
        sent = {"model_bytes": 0, "models": {}}
        if not used:
            return sent
        cluster = self.require_cluster()
        states = states or {name: model_sync.ModelState.of(model) for name, model in used.items()}
        have = {eid: cluster.client[eid].apply_async(model_sync.digests, list(used)) for eid in engine_ids}
        have = {eid: ar.get(timeout=LIMITS.definition_s) for eid, ar in have.items()}
        calls = []
        by_code = {name for name, model in used.items() if model_sync.rebuild_error(model) is not None}
        for name, state in states.items():
            digest, blob = state.digest(), None
            functions = model_sync.functions_blob(used[name])  # the notebook's functions it names (a loss of its own)
            for eid in engine_ids:
                theirs = have[eid].get(name)
                if theirs is not None and theirs[1] == digest:
                    continue
                client = cluster.client[eid]
                # another architecture, or compiled there while the notebook's is not (an engine cannot uncompile)
                other = theirs is None or theirs[0] != state.architecture or (theirs[2] and not state.compile)
                if name in by_code and other:
                    # the statements that made it run there again (the bring plan), its state installed after
                    calls.append((eid, client.apply_async(namespace.forget, [f"bring:{name}"])))
                    continue
                if other and not values:
                    calls.append((eid, client.apply_async(model_sync.receive_skeleton, name,
                                                          model_sync.skeleton(used[name]), functions, state.seeds)))
                elif other:
                    blob = blob or pickle.dumps(used[name])
                    calls.append((eid, client.apply_async(model_sync.receive, name, blob, functions, state.seeds)))
                    sent["model_bytes"] += len(blob)
                elif not values:
                    calls.append((eid, client.apply_async(model_sync.install, name, state.settings(), functions)))
                else:
                    calls.append((eid, client.apply_async(model_sync.install, name, state, functions)))
                    sent["model_bytes"] += state.nbytes
                sent["models"].setdefault(name, []).append(eid)
        for eid, call in calls:
            self._raise_sync_error(cluster, eid, call)
        return sent

    # -- what the cell uses, brought (no marks needed) -----------------------------------------
    def _cell_objects(self, cell: str, strategy, workers: list[int]) -> set[str]:
        """The optimizers and metrics a training cell reads (a loop's, a GAN's two that its compile keeps): their
        notebook state goes with the run (`strategy.loop_states`, installed on each engine before the cell); those
        an engine already holds (same class and config) are not brought again, so its traced steps keep stepping
        the same objects. Returns their names."""
        if self.shell is None:
            return set()
        from ..engine import loop_state

        objects = loop_state.cell_objects(self._python(cell), self.shell.user_ns)
        strategy.loop_states, objects = loop_state.carried(objects, self.models_used(cell))
        if not objects:
            return set()
        cluster = self.require_cluster()
        have = [cluster.client[eid].apply_async(loop_state.object_digests, list(objects)) for eid in workers]
        have = [ar.get(timeout=LIMITS.definition_s) for ar in have]
        return {name for name, value in objects.items()
                if all(theirs.get(name) == loop_state.config_digest(value) for theirs in have)}

    def bring_plan(self, cell: str, names: list[str] | None = None, skip: set[str] = frozenset()) -> list[bring.Item]:
        """What the cell (or `names`) needs from this notebook that marked cells and model sync do not give."""
        from ..model_parts import model_sync
        from .bring.names import bindings

        if self.shell is None:
            return []
        python = self.shell.transform_cell(cell)
        namespace = self.shell.user_ns
        marked = {n for d in self.definitions.values() for n in bindings(self._python(d.source))}
        models = model_sync.models_used(python, namespace)
        also = model_sync.own_classes(models.values(), namespace)  # the models' custom layers, for their unpickling
        rebuilt = {n for n, m in models.items() if model_sync.rebuild_error(m) is None}  # the others: by their code
        items = bring.plan(python, namespace, self._notebook_cells(), marked | rebuilt | set(skip), names, also)
        for item in items:  # a value remade on the engines draws what its cell drew here
            if item.remade and item.cell is not None:
                item.random_state = self.random_before.get(item.cell)
        return items

    def _notebook_cells(self) -> list[tuple[int, str]]:
        history = self.shell.user_ns.get("In") or []
        return [(i, self._python(source)) for i, source in enumerate(history) if source and source.strip()]

    def _python(self, source: str) -> str:
        python = self._transformed.get(source)
        if python is None:
            python = self._transformed[source] = self.shell.transform_cell(source)
        return python

    def _shard_names(self, cell: str, strategy) -> set[str]:
        """The arrays each worker gets only its strided shard of (the strategy shards so, the cell reads them
        only as fit's data)."""
        from .bring.names import fit_array_names

        return fit_array_names(self._python(cell)) if strategy.array_shards() else set()

    def _before_models(self, cell: str, strategy, items: list[bring.Item]) -> tuple[list, list]:
        """The part of a bring plan the engines need before the notebook's models reach them (imports, the
        notebook's classes and functions, the values they read), and the rest (values sent by shard, in rank
        order once the strategy has prepared, and the statements that remake a value from them)."""
        later = self._shard_names(cell, strategy)
        return ([i for i in items if not (i.remade or i.name in later)],
                [i for i in items if i.remade or i.name in later])

    def _bring(self, run: runs.Run, strategy, items: list[bring.Item], newcomer=None) -> None:
        """Send the rest of the plan to the run's workers (in rank order, after the strategy has prepared), or
        part of it to one `newcomer` (engine, (rank, size)) joining the running run."""
        shard_names = self._shard_names(run.cell, strategy)
        early = run.sent.get("brought") or {"names": [], "data_bytes": 0, "sharded": [], "digests": {}}
        if newcomer is not None:
            bring.send(items, self.require_cluster(), [newcomer[0]], shard_names, dict([newcomer]), early["digests"])
            if any(item.remade for item in items):
                self.sync_models(run.cell, [newcomer[0]])
            return
        late = (bring.send(items, self.require_cluster(), run.workers, shard_names, digests=early["digests"])
                if items else early)
        if any(item.remade for item in items):  # a model made again by its statements takes the notebook's state
            self.sync_models(run.cell, run.workers)
        brought = early if late is early else {**{k: early[k] + late[k] for k in ("names", "data_bytes", "sharded")},
                                               "digests": late["digests"]}
        if not brought["names"] and not items:
            return
        run.sent["brought"] = brought
        if brought["names"]:
            sharded = f"; {', '.join(brought['sharded'])} as one shard per worker" if brought["sharded"] else ""
            print(f"nbdist: brought {', '.join(brought['names'])} to the engines "
                  f"({brought['data_bytes'] / 1e6:.1f} MB of data{sharded})", flush=True)

    def _prepare_newcomer(self, run: runs.Run, strategy, items: list[bring.Item], eid: int,
                          position: tuple[int, int]) -> None:
        """What the run's workers received before training, for engine `eid` joining it as (rank, size)."""
        self.sync_definitions([eid])
        first, rest = self._before_models(run.cell, strategy, items)
        self._bring(run, strategy, first, newcomer=(eid, position))
        self.sync_models(run.cell, [eid])
        self._bring(run, strategy, rest, newcomer=(eid, position))

    def push(self, names: list[str]) -> dict:
        """`%dist push NAME ...`: send these names (values, functions, modules) to every engine now."""
        if not names:
            raise OptionError("%dist push needs the names to send, like %dist push x y build.")
        missing = [n for n in names if n not in self.shell.user_ns]
        if missing:
            raise OptionError(f"%dist push: {', '.join(missing)} not defined in this notebook.")
        cluster = self.require_cluster()
        return bring.send(self.bring_plan("", names), cluster, sorted(cluster.ids()))

    @staticmethod
    def _raise_sync_error(cluster, eid, ar):
        import ipyparallel as ipp

        try:
            ar.get(timeout=LIMITS.definition_s)
        except ipp.error.RemoteError as exc:
            if exc.ename == "EngineError":  # ipyparallel's word for a task stranded by a dead engine
                raise EngineDied(f"{cluster.info(eid).label()} died while it received the notebook's model: "
                                 f"{KILLED_FROM_OUTSIDE}. A model too large for one engine trains under --strategy "
                                 "pipeline or tensor.") from None
            raise DefinitionFailed(
                f"the notebook's model could not be given to {cluster.info(eid).label()}: {exc.ename}: {exc.evalue}. "
                "If it uses layers or losses defined in the notebook, put those in a %%distribute define cell "
                "(or register them with keras.saving.register_keras_serializable).",
                runs.user_frames(exc.traceback or "")) from None

    @staticmethod
    def _raise_definition_error(cluster, eid, ar, definition):
        import ipyparallel as ipp

        try:
            ar.get(timeout=LIMITS.definition_s)
        except ipp.error.RemoteError as exc:
            raise DefinitionFailed(
                f"definition cell {definition.index} failed on {cluster.info(eid).label()}: "
                f"{exc.ename}: {exc.evalue}. Fix it there (for a missing package, install it on that host) "
                "and re-run the training cell.", runs.user_frames(exc.traceback or "")) from None
        except TimeoutError:
            raise DefinitionFailed(
                f"definition cell {definition.index} did not finish within {LIMITS.definition_s} s on "
                f"{cluster.info(eid).label()}.") from None

    # -- training cells ------------------------------------------------------------------
    def choose_strategy(self, cell: str, options: dict) -> dict | None:
        """`--strategy auto`: plan the cell on the cluster, print the plan and the choice; the options of the
        chosen strategy, or None with `--plan-only` (the plan is kept for `%dist plan`)."""
        from ..planner import auto

        self.last_plan = auto.plan(self, cell, options)
        return auto.announce(self.last_plan, options)

    def plan_table(self, workers: str | None = None, accuracy: bool = True) -> str:
        """The last plan's table; with `workers` ("8,32,128") its predictions at those worker counts."""
        from ..planner.auto import plan_table

        return plan_table(self.last_plan, workers, self if accuracy else None)

    def distribute(self, cell: str, options: dict, on_progress=None, strategy=None) -> runs.Run:
        """Train the cell on the engines, then run it here with `fit` installing the results.

        With `options["background"]` the training runs in a thread and this returns the Run at once; `wait`
        blocks until it ends and installs the results. `strategy`: one made elsewhere (the planner's profile).
        """
        if not cell.strip():
            raise OptionError("%%distribute needs a training cell below the magic line, with a model.fit(...) call.")
        strategy = strategy or self._strategy_for(cell, options)
        self._check_training(cell, strategy)
        cluster = self.require_cluster()
        workers = self._choose_workers(strategy, cluster, options)
        strategy.values["plan_limit"] = _short_run_share(options.get("plan_samples"), strategy, workers)
        cluster.refresh(workers)
        self.sync_definitions(workers, empty_weights=strategy.fills_own_part)
        kept = self._cell_objects(cell, strategy, workers)
        items = [] if options.get("no_bring") else self.bring_plan(cell, skip=kept)  # a refusal comes before any work
        first, rest = self._before_models(cell, strategy, items)
        early = bring.send(first, cluster, workers) if first else None  # the classes the notebook's models use
        if strategy.fills_own_part:  # the values its engines fetch, each its own part (the cell's start state)
            from ..model_parts.model_sync import ModelState

            strategy.notebook_models = {name: ModelState.of(m) for name, m in self.models_used(cell).items()}
        sent = self.sync_models(cell, workers, values=not strategy.fills_own_part, states=strategy.notebook_models)
        run = runs.Run(strategy=strategy.name, options=dict(options), workers=workers, cell=cell,
                       cell_id=self.current_cell_id, sent={**sent, **({"brought": early} if early else {})})
        self.runs.append(run)
        self.changed("run")
        progress = on_progress(run) if on_progress else None
        run.display = progress

        def tick(run):
            (progress or (lambda _run: None))(run)
            self.changed("progress")

        def train():
            try:
                runs.execute(run, cluster, strategy, on_progress=tick,
                             before_submit=lambda: self._bring(run, strategy, rest),
                             prepare_newcomer=lambda eid, rank, size: self._prepare_newcomer(
                                 run, strategy, items, eid, (rank, size)))
            finally:
                if progress is not None:
                    progress.close()
                self.changed("run")

        if options.get("background"):
            run.thread = runs.Background(train)
            return run
        train()
        self._conclude(run)
        return run

    def _check_training(self, cell: str, strategy) -> None:
        """From the cell's text, before any engine is touched: a cell that neither fits nor steps an optimizer is
        refused, so is a loop under a strategy that cannot run one, or one iterating data it cannot share out."""
        if self.shell is None:
            return
        from ..engine.loop_data import refuse_unshareable
        from ..keras_semantics.training_code import training_of

        training = training_of(self._python(cell), self.shell.user_ns)
        if not (training.fit or training.steps):
            raise NoFitCall("the training cell would train nothing: it runs without calling model.fit(...) and "
                            "without stepping an optimizer (optimizer.apply or apply_gradients after tape.gradient). "
                            "Put the fit call or the training loop in the %%distribute cell (it may call a function "
                            "that does), or run the cell without %%distribute.")
        if training.fit and training.steps:
            raise OptionError("the training cell both calls fit(...) and steps an optimizer itself (a loop of its "
                              "own): put the hand-written loop and the fit in cells of their own.")
        strategy.training = asdict(training)
        if training.loop:
            strategy.refuse_loop()
            if strategy.max_workers != 1:
                refuse_unshareable(training.data_loops, self.shell.user_ns)

    @staticmethod
    def _choose_workers(strategy, cluster, options) -> list[int]:
        """The run's engines; engines started a moment ago get a few seconds to reach this client."""
        targets = _parse_targets(options.get("targets"))
        still = cluster.settle(LIMITS.stop_s)  # engines a stopped run left still ending its cell
        if still and not options.get("workers") and targets and set(targets) & set(still):
            raise ClusterError(f"engine(s) {sorted(set(targets) & set(still))} still run the cell of a run that was "
                               f"stopped {LIMITS.stop_s:g} s ago (stuck in its own code or a collective?): interrupt "
                               "the kernel again, or restart those engines, then run this cell again.")
        deadline = time.time() + LIMITS.registration_grace_s
        while True:
            ids = set(cluster.ids())  # the hub lists a killed engine for a while: its process is checked too
            available = sorted(e for e in ids - cluster.busy() if cluster.is_alive(e, ids))
            try:
                return strategy.choose_workers(available, options.get("workers"), targets)
            except ClusterError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)  # the hub's registration notice is on its way to this client

    def wait(self, run: runs.Run | None = None) -> runs.Run:
        """Block until a --background run ends (the last one by default), then install its results here."""
        pending = [r for r in self.runs if r.thread is not None]
        run = run or (pending[-1] if pending else None)
        if run is None or run.thread is None:
            raise OptionError("no --background run to wait for (see %dist runs).")
        try:
            run.thread.join()
        except KeyboardInterrupt:
            run.stop(interrupt=True)  # the run's own loop stops its engines and reports it
            run.thread.join()
        thread, run.thread = run.thread, None
        thread.reraise()
        self._conclude(run)
        return run

    def _conclude(self, run: runs.Run) -> None:
        for line in run.event_lines():
            print(f"nbdist: {line}.")
        for note in run.notes:
            print(note)
        for why in dict.fromkeys(f.timings.get("data") for f in run.fits if f.timings.get("data")):
            print(f"nbdist: --data dynamic fell back: {why}.")
        if run.options.get("planned_epoch_s"):
            from ..planner.auto import against_plan

            if line := against_plan(run):
                print(f"nbdist: {line}.")
        if run.virtual_step:
            print(f"nbdist: virtual clock: a step at speed 1 costs {run.virtual_step}; --simulate \"...; "
                  f"clock=virtual; step={run.virtual_step}\" reproduces this run.")
        for written in (f for fit in run.fits for f in fit.files):
            note = written.get("note") or "rank 0's engine; the other workers did not write files"
            print(f"nbdist: {written['callback']} of the cell wrote {written['path']} on host {written['host']} "
                  f"({note}).")
        conclude = getattr(run.display, "conclude", None)
        if conclude is not None:
            conclude()
        self.replay_locally(run)

    def replay_locally(self, run: runs.Run) -> None:
        """Run the training cell in the notebook with each `fit` returning the run's result; a cell that stepped its
        optimizers itself runs here without the statements that did, what they left on rank 0 installed instead."""
        loop = next((fit.loop for fit in run.fits if fit.loop is not None), None)
        if loop is not None:
            return self._replay_loop(run, loop)
        results = iter(run.fits)
        problems: list[str] = []

        def install(request):
            result = next(results, None)
            if result is None:
                raise OptionError("this cell called fit more times here than it did on the engines; "
                                  "make the number of fit calls deterministic.")
            history, left = install_result(request.model, result, request, request.callbacks,
                                           self.require_cluster().client)
            problems.extend(left)
            return history

        if run.options.get("seed") is not None:  # what the cell computes besides fit matches the engines'
            import keras

            keras.utils.set_random_seed(run.options["seed"])
        with intercept_fit(install):
            outcome = self.shell.run_cell(run.cell, store_history=False)
        if not outcome.success:
            raise NbdistError(f"run {run.id} trained on the engines, but the cell failed here (see above); "
                              f"its results are in nbdist.last_run.")
        cell_state = next((fit.cell_state for fit in reversed(run.fits) if fit.cell_state is not None), None)
        if cell_state is not None:  # what else of the cell's names the engines changed (a metric it made)
            from .results import install

            namespace = self.shell.user_ns
            problems += install(cell_state, {n: namespace[n] for n in cell_state.roots if n in namespace})
        self._tell_left(run, problems)

    @staticmethod
    def _tell_left(run: runs.Run, problems: list[str]) -> None:
        """Say under the cell what of the engines' state could not come back into the notebook (never silent)."""
        for problem in dict.fromkeys(problems):
            run.left.append(problem)
            print(f"nbdist: {problem}.")


    def _replay_loop(self, run: runs.Run, loop: dict) -> None:
        from ..engine import loop_state
        from ..keras_semantics.step_seam import no_steps_here

        for name, share in loop.get("shards", {}).items():
            print(f"nbdist: each worker's loop iterated {share} of {name}.")
        source = loop_state.replay_source(self._python(run.cell), loop["snapshots"], loop["ran"])
        namespace = self.shell.user_ns

        def install(index: int) -> None:
            snapshot = loop["snapshots"][index]
            if snapshot.stdout:
                print(snapshot.stdout, end="" if snapshot.stdout.endswith("\n") else "\n")
            self._tell_left(run, loop_state.install(snapshot, namespace))

        if run.options.get("seed") is not None:
            import keras

            keras.utils.set_random_seed(run.options["seed"])
        namespace[loop_state.INSTALL] = install
        try:
            with no_steps_here():
                outcome = self.shell.run_cell(source, store_history=False)
        finally:
            namespace.pop(loop_state.INSTALL, None)
        if loop.get("stopped"):
            print(f"nbdist: run {run.id} was stopped: the loop ended after its step {loop['steps']}, and the cell's "
                  "later statements did not run.")
        if not outcome.success:
            raise NbdistError(f"run {run.id} trained on the engines, but the cell failed here (see above); "
                              f"its results are in nbdist.last_run.")


def _short_run_share(samples: int | None, strategy, workers: list[int]) -> int | None:
    """A planner's short run: the samples each engine keeps of what it holds (its shard, or all the arrays)."""
    if not samples:
        return None
    return samples // len(workers) if strategy.array_shards() else samples


def _parse_targets(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(part) for part in str(text).replace(" ", "").split(",") if part]
    except ValueError:
        raise OptionError(f"--targets takes engine ids separated by commas, like 0,2. Received: --targets {text}")


SESSIONS: dict[int, Session] = {}  # id(shell) -> its Session (`%load_ext nbdist` makes one per shell)


def get_session(shell=None) -> Session | None:
    """The Session of `shell` (default: the running IPython shell)."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    return SESSIONS.get(id(shell))
