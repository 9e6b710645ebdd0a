"""`%dist` and `%%distribute`: parsing and dispatch only; the work happens in Session."""

from __future__ import annotations

import os

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from .host import gpus, threads
from .notebook import report
from .notebook.progress import TextProgress
from .strategies import COMMON_OPTIONS, on_register, strategy_names, strategy_options

DIST_ACTIONS = ("start", "add", "connect", "stop", "status", "runs", "wait", "push", "cap", "plan")


def distribute_parser():
    """The `%%distribute` parser, from the registry's options (rebuilt when a strategy is registered)."""
    global _parser
    if _parser is None:
        parser = magic_arguments.MagicArgumentParser(prog="%distribute", add_help=False)
        parser.add_argument("mode", nargs="?", choices=["define"],
                            help="`define`: run this cell here and replay it on every engine before training")
        parser.add_argument("--name", default=None,
                            help="define: a name for the definition cell (default: the notebook cell's id)")
        for option in (*COMMON_OPTIONS, *strategy_options().values()):
            kwargs = option.argparse()
            if option.flag == "--strategy":
                kwargs["choices"] = [*strategy_names(), "auto"]
                kwargs["help"] += (f"; one of: {', '.join(strategy_names())} (default local), or auto (measure the "
                                   "engines on the cell's model, predict every strategy, train with the fastest)")
            parser.add_argument(option.flag, **kwargs)
        _parser = parser
    return _parser


def _forget_parser(_cls=None) -> None:
    global _parser
    _parser = None
    NbdistMagics.distribute.__doc__ = _DISTRIBUTE_DOC + "\n" + distribute_parser().format_help()


_parser = None


@magics_class
class NbdistMagics(Magics):
    """The nbdist magics of one IPython shell, bound to one Session."""

    def __init__(self, shell, session):
        super().__init__(shell)
        self.session = session

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("action", choices=DIST_ACTIONS, help="what to do: " + ", ".join(DIST_ACTIONS))
    @magic_arguments.argument("names", nargs="*", metavar="NAME", help="push: the names to send to every engine")
    @magic_arguments.argument("-n", type=int, default=None, metavar="N", help="start: number of engines (default 2); add: how many more")
    @magic_arguments.argument("--engines", default="local", metavar="LAUNCHER",
                              help="start: ipyparallel engine launcher: local, mpi, ssh, slurm, pbs, ...")
    @magic_arguments.argument("--profile", default=None, help="start/connect: ipyparallel profile")
    @magic_arguments.argument("--cluster-id", default=None, help="connect: cluster id within the profile")
    @magic_arguments.argument("--file", default=None, help="connect: path of an ipcontroller-client.json")
    @magic_arguments.argument("--kernel-gpu", action="store_true",
                              help="start/connect: let this kernel's TensorFlow use the GPUs too (nbdist hides them "
                                   "from it); engines on this host then share them with memory growth")
    @magic_arguments.argument("--threads", default=None, metavar="N",
                              help="start/connect: TensorFlow intra-/inter-op threads of each engine (default: its "
                                   "share of its host's cores: cores / engines of the host, at least 1); `off` "
                                   "leaves TensorFlow's default (every core, for each engine)")
    @magic_arguments.argument("--memory", default=None, metavar="SIZE",
                              help="cap: each engine's memory from now on, as on a smaller host (760M, 2G; none "
                                   "lifts it); engines on this machine, as root (cgroup v1 memory controller)")
    @magic_arguments.argument("--targets", default=None, metavar="IDS",
                              help="cap: the engines to cap, comma-separated (default: all)")
    @magic_arguments.argument("--workers", default=None, metavar="N,N",
                              help="plan: the last plan's predictions at these worker counts (the measured engines' "
                                   "speeds repeated), like --workers 8,32,128; their accuracy from short runs of "
                                   "that many virtual workers on one engine")
    @magic_arguments.argument("--no-accuracy", action="store_true",
                              help="plan --workers: epoch times only (no short runs of virtual workers)")
    @magic_arguments.argument("--stale", action="store_true",
                              help="stop: stop the clusters that previous kernels of this notebook left "
                                   "running (status names them), not this kernel's")
    @line_magic
    def dist(self, line):
        """Start, connect to, inspect or stop the cluster nbdist trains on.

        Examples::

            %dist start -n 4                 # 4 local engines through ipyparallel.Cluster
            %dist start -n 8 --engines mpi   # any ipyparallel launcher
            %dist start -n 2 --kernel-gpu    # the notebook's own TensorFlow may use the GPUs too
            %dist start -n 4 --threads 2     # 2 TensorFlow threads per engine (default: its share of the host)
            %dist add -n 2                   # 2 more engines; a running run takes them in
            %dist connect --profile mycluster
            %dist status                     # one row per engine
            %dist runs                       # the runs of this kernel
            %dist wait                       # until the last --background run ends
            %dist push x y build             # send these to every engine now (nbdist brings what a
                                             # training cell uses by itself; this is for the rest)
            %dist cap --memory 760M          # each engine as a host with 760 MB (try what fits)
            %dist stop
            %dist stop --stale               # clusters a previous (killed) kernel left running
            %dist plan                       # the last --strategy auto plan's table
            %dist plan --workers 8,32,128    # ... predicted at worker counts this cluster does not have
        """
        args = _parse(self.dist.parser, line, "dist")
        _refuse_unused(self.dist.parser, args)
        if args.names and args.action != "push":
            raise UsageError(f"%dist {args.action} takes no names ({' '.join(args.names)}); see %dist?")
        if args.kernel_gpu and (notice := gpus.give_to_kernel()):
            print(notice)
        self._dist_action(args)

    def _dist_action(self, args) -> None:
        session = self.session
        if args.action == "start":
            n = 2 if args.n is None else args.n
            if n < 1:
                raise UsageError(f"%dist start -n takes a positive number of engines. Received: -n {n}")
            session.start(n, args.engines, args.profile, threads=_threads(args.threads))
            _print_engines(session.cluster)
        elif args.action == "add":
            if not args.n or args.n < 1:
                raise UsageError("%dist add -n K starts K more engines (K at least 1), like %dist add -n 1")
            added = session.add(args.n)
            print(f"nbdist: started engine(s) {added}" + "".join(
                f"; run {r.id} takes them in as they register" for r in session.runs
                if r.status == "running" and r.controller is not None and r.controller.takes_newcomers))
            _print_engines(session.cluster)
        elif args.action == "connect":
            if not (args.profile or args.cluster_id or args.file):
                args.profile = "default"
            session.connect(profile=args.profile, cluster_id=args.cluster_id, file=args.file,
                            threads=_threads(args.threads))
            _print_engines(session.cluster)
        elif args.action == "stop":
            print(f"nbdist: {session.stop_stale() if args.stale else session.stop()}")
        elif args.action == "status":
            notice = session.stale_notice()
            if session.cluster is not None or not notice:
                _print_engines(session.require_cluster())
            if notice:
                print(notice)
        elif args.action == "runs":
            print(report.run_table(session.runs))
        elif args.action == "wait":
            session.wait()
        elif args.action == "cap":
            if not args.memory:
                raise UsageError("%dist cap --memory SIZE caps each engine's memory, like %dist cap --memory 760M")
            print(f"nbdist: {session.cap(args.memory, args.targets)}")
        elif args.action == "plan":
            print(session.plan_table(args.workers, accuracy=not args.no_accuracy))
        elif args.action == "push":
            sent = session.push(args.names)
            print(f"nbdist: sent {', '.join(sent['names']) or 'nothing (the engines have them)'} "
                  f"({sent['data_bytes'] / 1e6:.1f} MB of data)")

    @cell_magic
    def distribute(self, line, cell):
        """Train this cell's `model.fit(...)` on the cluster, or record a definition cell.

        Examples::

            %%distribute define
            import keras
            def build(): ...

            %%distribute --strategy local --seed 1
            model = build()
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
            history = model.fit(x, y, epochs=1)
        """
        args = _parse(distribute_parser(), line, "distribute")
        if args.mode == "define":
            return self._define(args, cell)
        options = self._training_options(args)
        if options["strategy"] == "auto" and (options := self._auto(cell, options)) is None:
            return
        run = self.session.distribute(cell, options, on_progress=_progress_display(options["progress"]))
        if options.get("background"):
            print(f"nbdist: run {run.id} training in the background on engine(s) {run.workers}; "
                  "nbdist.last_run is its handle, %dist wait blocks until it ends.")

    async def distribute_async(self, line, cell):
        """`%%distribute` with the dashboard: the cell awaits the run, so the kernel's event loop stays
        free and the dashboard's buttons reach the running job (the input transformer routes here)."""
        import asyncio

        options = self._training_options(_parse(distribute_parser(), line, "distribute"))
        if options["strategy"] == "auto" and (options := self._auto(cell, options)) is None:
            return
        kernel = getattr(self.shell, "kernel", None)
        cell_request = (kernel._parent_ident["shell"], kernel.get_parent("shell")) if kernel else None
        run = self.session.distribute(cell, {**options, "background": True},
                                      on_progress=_progress_display(options["progress"]))
        try:
            while run.thread.alive:
                await asyncio.sleep(0.1)
        except (asyncio.CancelledError, KeyboardInterrupt):  # the kernel's interrupt, in an async cell
            run.stop(interrupt=True)
        if cell_request is not None:  # widget messages handled meanwhile may have left theirs as the parent
            kernel.set_parent(*cell_request, channel="shell")
        self.session.wait(run)

    def _auto(self, cell: str, options: dict) -> dict | None:
        """`--strategy auto`: the plan's table (and chart, where a front end shows one); the chosen options."""
        chosen = self.session.choose_strategy(cell, options)
        if _in_kernel():
            from IPython.display import display

            from .planner.chart import plan_figure

            display(plan_figure(self.session.last_plan))
        return chosen

    def _training_options(self, args) -> dict:
        if args.name is not None:
            raise UsageError("--name applies to `%%distribute define` cells only")
        return {k: v for k, v in vars(args).items() if k not in ("mode", "name")}

    def _define(self, args, cell):
        given = [o.flag for o in (*COMMON_OPTIONS, *strategy_options().values())
                 if getattr(args, o.name) not in (None, o.default)]
        if given:
            raise UsageError(f"{', '.join(given)} applies to training cells, not to `%%distribute define`")
        cell_id = self.session.current_cell_id  # read before the nested run_cell resets it
        outcome = self.shell.run_cell(cell, store_history=False)
        if not outcome.success:
            raise UsageError("the definition cell failed here (see above), so it was not recorded")
        self.session.record_definition(cell, name=args.name or cell_id)


def _threads(text):
    """`--threads` as `Session.start` takes it; a bad value is the user's to fix."""
    try:
        return threads.parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _print_engines(cluster) -> None:
    """The engine table, then what engines lack compared with the notebook (each warning once per connection)."""
    rows = cluster.inventory()
    print(report.engine_table(rows))
    placed = report.cache_lines(cluster.cache_holdings())
    if placed:
        print(placed)
    warnings = report.compatibility_notice(cluster, rows)
    if warnings:
        print(warnings)


PROGRESS_ENV = "NBDIST_PROGRESS"  # text / none / dashboard: what auto means here (set it for nbconvert, CI)


def _resolve_progress(choice: str) -> str:
    """auto -> $NBDIST_PROGRESS if set, else the dashboard in a Jupyter kernel and text elsewhere
    (terminal IPython). A kernel cannot tell a browser from nbconvert, so headless runs set the variable."""
    if choice != "auto":
        return choice
    preset = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if preset in ("dashboard", "text", "none"):
        return preset
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "text"
    return "dashboard" if _in_kernel() else "text"


def _progress_display(choice: str):
    """The on_progress factory for a `--progress` choice."""
    choice = _resolve_progress(choice)
    if choice == "dashboard":
        from .notebook.widgets import Dashboard  # the only import of the widgets (DESIGN.md section 3)

        return Dashboard
    return TextProgress if choice == "text" else None


def async_dashboard_cells(lines: list[str]) -> list[str]:
    """Input transformer: a foreground `%%distribute` training cell with the dashboard becomes an
    awaited call, so the kernel keeps handling widget messages while the cell runs."""
    import shlex

    if not lines or not lines[0].startswith("%%distribute"):
        return lines
    line = lines[0][len("%%distribute"):].strip()
    try:
        tokens = shlex.split(line)
    except ValueError:
        return lines  # the magic itself reports the quoting error
    if (tokens and tokens[0] == "define") or "--background" in tokens or not _in_kernel():
        return lines
    progress = next((t.split("=", 1)[1] for t in tokens if t.startswith("--progress=")), None)
    if "--progress" in tokens and tokens.index("--progress") + 1 < len(tokens):
        progress = tokens[tokens.index("--progress") + 1]
    if _resolve_progress(progress or "auto") != "dashboard":
        return lines
    cell = "".join(lines[1:])
    return [f"await get_ipython().find_cell_magic('distribute').__self__.distribute_async({line!r}, {cell!r})\n"]


def _in_kernel() -> bool:
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def parser_actions(parser) -> list:
    """An argparse parser's arguments. argparse keeps them only in the private `_actions`; this is the one
    place nbdist reads it (the unknown-flag check, the unused-option check, README's options table)."""
    return list(parser._actions)


def _parse(parser, line, name: str):
    """parse_argstring, but an unknown flag is named (with a suggestion) before anything else."""
    import difflib
    import shlex

    known = [flag for action in parser_actions(parser) for flag in action.option_strings]
    try:
        tokens = shlex.split(line)  # POSIX quoting: --simulate "speed=1,0.5; latency=5ms" is one value
    except ValueError as exc:
        raise UsageError(f"%{name}: {exc} (check the quotes). See %{name}? for all options.")
    for token in tokens:
        flag = token.split("=", 1)[0]
        if flag.startswith("-") and not _is_number(flag) and flag not in known:
            close = difflib.get_close_matches(flag, known, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise UsageError(f"unknown option {flag} for %{name}.{hint} See %{name}? for all options.")
    return parser.parse_args(tokens)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


_DIST_ARGS_BY_ACTION = {"start": {"n", "engines", "profile", "kernel_gpu", "threads"}, "add": {"n"},
                        "connect": {"profile", "cluster_id", "file", "kernel_gpu", "threads"},
                        "stop": {"stale"}, "cap": {"memory", "targets"}, "plan": {"workers", "no_accuracy"}}


def _refuse_unused(parser, args):
    """An option given a value that the chosen action does not read is an error, not ignored."""
    used = _DIST_ARGS_BY_ACTION.get(args.action, set())
    extra = [action.option_strings[0] for action in parser_actions(parser)
             if action.option_strings and action.dest not in used | {"help"}
             and getattr(args, action.dest) != action.default]
    if extra:
        raise UsageError(f"{', '.join(extra)} does not apply to %dist {args.action}; see %dist?")


_DISTRIBUTE_DOC = NbdistMagics.distribute.__doc__
_forget_parser()
on_register(_forget_parser)
