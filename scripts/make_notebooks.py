"""Write the example notebooks from their cell sources (kept here so diffs stay readable)."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

QUICKSTART = [
    new_markdown_cell(
        "# nbdist quickstart\n\n"
        "Train an unchanged Keras cell on an ipyparallel engine and get the trained model back in the notebook.\n\n"
        "1. `%dist start` starts a local cluster (any ipyparallel launcher works: `--engines mpi`, `ssh`, `slurm`).\n"
        "2. `%%distribute define` cells run here **and** on every engine.\n"
        "3. The training cell runs under `%%distribute`; afterwards `model` holds the trained weights."),
    new_code_cell("%load_ext nbdist\n%dist start -n 2"),
    new_code_cell(
        "%%distribute define\n"
        "import keras\n"
        "from nbdist.datasets import fashion_mnist\n\n"
        "(x, y), (x_test, y_test) = fashion_mnist()\n"
        "x, y = x[:20000].astype(\"float32\")[..., None] / 255, y[:20000]\n"
        "x_test = x_test.astype(\"float32\")[..., None] / 255\n\n"
        "def build():\n"
        "    return keras.Sequential([\n"
        "        keras.Input((28, 28, 1)),\n"
        "        keras.layers.Conv2D(16, 3, activation=\"relu\"),\n"
        "        keras.layers.MaxPooling2D(),\n"
        "        keras.layers.Conv2D(32, 3, activation=\"relu\"),\n"
        "        keras.layers.MaxPooling2D(),\n"
        "        keras.layers.Flatten(),\n"
        "        keras.layers.Dense(64, activation=\"relu\"),\n"
        "        keras.layers.Dense(10, activation=\"softmax\"),\n"
        "    ])"),
    new_markdown_cell("The training cell is plain Keras. `--strategy local` trains on one engine with Keras' own `fit`: "
                      "the reference every other strategy is measured against."),
    new_code_cell(
        "%%distribute --strategy local --seed 0\n"
        "model = build()\n"
        "model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),\n"
        "              loss=\"sparse_categorical_crossentropy\", metrics=[\"accuracy\"])\n"
        "history = model.fit(x, y, batch_size=64, epochs=2, validation_split=0.1)"),
    new_markdown_cell("The next cell is ordinary notebook code: `model` already holds the weights trained on the engine."),
    new_code_cell(
        "loss, accuracy = model.evaluate(x_test, y_test, verbose=0)\n"
        "print(f\"test accuracy: {accuracy:.4f}\")\n"
        "print(\"history keys:\", sorted(history.history))"),
    new_code_cell(
        "# NBVAL_CHECK_OUTPUT\n"
        "assert accuracy > 0.80, accuracy\n"
        "print(\"accuracy above the 0.80 floor:\", accuracy > 0.80)"),
    new_code_cell("%dist runs"),
    new_code_cell("%dist stop"),
]

HFDT = [
    new_markdown_cell(
        "# HFDT: synchronous data parallel training with Horovod\n\n"
        "The same unchanged Keras cell, trained by 2 engines that average their gradients with Horovod's "
        "ring-allreduce after every step. Each engine trains on its own half of the data with the batch size "
        "the cell asks for, so the global batch is 2 x 64."),
    new_code_cell("%load_ext nbdist\n%dist start -n 2"),
    QUICKSTART[2],
    new_markdown_cell(
        "Options used below:\n\n"
        "- `--scale-lr linear` (the default): the learning rate is multiplied by the number of workers, since the "
        "global batch grew by as much; `--warmup-epochs 1` ramps it up over the first epoch (Goyal et al., 2017).\n"
        "- `--compression fp16`: gradients travel as float16 on the allreduce, half the bytes."),
    new_code_cell(
        "%%distribute --strategy hfdt --workers 2 --compression fp16 --warmup-epochs 1 --seed 0\n"
        "model = build()\n"
        "model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),\n"
        "              loss=\"sparse_categorical_crossentropy\", metrics=[\"accuracy\"])\n"
        "history = model.fit(x, y, batch_size=64, epochs=2, validation_data=(x_test, y_test))"),
    new_code_cell(
        "import nbdist\n"
        "run = nbdist.last_run\n"
        "ranks = [run.results[engine][-1].weights for engine in run.workers]\n"
        "spread = max(float(abs(a - b).max()) for a, b in zip(*ranks))\n"
        "print(\"largest weight difference between the two ranks:\", spread)\n"
        "last_lr = {r[\"worker\"]: r[\"lr\"] for r in run.metrics}\n"
        "print(\"learning rate on each rank at the end:\", last_lr, \"(0.05 x 2 workers)\")\n"
        "loss, accuracy = model.evaluate(x_test, y_test, verbose=0)\n"
        "print(f\"test accuracy: {accuracy:.4f}\")"),
    new_code_cell(
        "# NBVAL_CHECK_OUTPUT\n"
        "assert spread <= 1e-6 and accuracy > 0.78, (spread, accuracy)\n"
        "print(\"ranks agree and accuracy is above the 0.78 floor:\", spread <= 1e-6 and accuracy > 0.78)"),
    new_code_cell("%dist stop"),
]

ASYNC = [
    new_markdown_cell(
        "# NFDT: asynchronous training through a parameter server\n\n"
        "Three engines train the same unchanged Keras cell without waiting for each other. Each step a worker "
        "pushes its gradient to nbdist's parameter server (a process on this host, over ZeroMQ, every message "
        "signed) and gets back the current weights; the server applies the optimizer compiled in the cell. "
        "A gradient computed on weights that other workers have since updated is *stale*: its staleness is how "
        "many updates landed in between."),
    new_code_cell("%load_ext nbdist\n%dist start -n 3"),
    QUICKSTART[2],
    new_markdown_cell(
        "The parameter server applies the optimizer the cell compiles (SGD, momentum, Nesterov or Adam, with "
        "their hyper-parameters and learning-rate schedules). Beware of heavy momentum with several "
        "asynchronous workers: asynchrony already acts like momentum (Mitliagkas et al., 2016). "
        "`--max-staleness 4` keeps any worker from running more than 4 steps ahead of the slowest; checkpoints "
        "go to `--checkpoint-dir` every `--checkpoint-every` seconds and at the end.\n\n"
        "This notebook runs on the **virtual clock** (`--simulate \"clock=virtual; step=5ms\"`): three engines "
        "that share this machine's cores would otherwise reach the parameter server in whatever order the "
        "operating system schedules them. On the virtual clock every step costs 5 ms of simulated time and "
        "the parameter server applies pushes in simulated-time order, so the staleness below is the same on "
        "every run (and what equal hosts would see): the three pushes of a round arrive together and go in "
        "rank order."),
    new_code_cell(
        "%%distribute --strategy nfdt --workers 3 --max-staleness 4 --seed 0 --simulate \"clock=virtual; step=5ms\"\n"
        "model = build()\n"
        "model.compile(optimizer=keras.optimizers.Adam(1e-3),\n"
        "              loss=\"sparse_categorical_crossentropy\", metrics=[\"accuracy\"])\n"
        "history = model.fit(x, y, batch_size=64, epochs=2, validation_data=(x_test, y_test))"),
    new_markdown_cell("What the parameter server saw, push by push (`nbdist.last_run.push_records`):"),
    new_code_cell(
        "import collections, statistics\n"
        "import nbdist\n"
        "run = nbdist.last_run\n"
        "pushes = run.push_records\n"
        "by_worker = collections.defaultdict(list)\n"
        "for record in pushes:\n"
        "    by_worker[record[\"worker\"]].append(record[\"staleness\"])\n"
        "print(\"worker  pushes  mean staleness  max staleness\")\n"
        "for worker, taus in sorted(by_worker.items()):\n"
        "    print(f\"{worker:>6}  {len(taus):>6}  {statistics.mean(taus):>14.2f}  {max(taus):>13}\")\n"
        "histogram = collections.Counter(r[\"staleness\"] for r in pushes)\n"
        "print(\"staleness histogram:\", dict(sorted(histogram.items())))\n"
        "print(\"PS counters:\", run.ps[0][\"counts\"])\n"
        "lead = max(entry[run.ps[0][\"log_fields\"].index(\"lead\")] for entry in run.ps[0][\"log\"])\n"
        "print(\"largest lead of a worker over the slowest:\", lead)\n"
        "print(\"checkpoint:\", run.checkpoint[\"path\"], \"at PS version\", run.checkpoint[\"version\"])\n"
        "loss, accuracy = model.evaluate(x_test, y_test, verbose=0)\n"
        "print(f\"test accuracy: {accuracy:.4f}\")"),
    new_code_cell(
        "# NBVAL_CHECK_OUTPUT\n"
        "ok = (max(histogram) > 0 and run.ps[0][\"counts\"][\"applied\"] == len(pushes)\n"
        "      and lead <= 4 and accuracy > 0.75)\n"
        "assert ok, (histogram, run.ps[0][\"counts\"], accuracy)\n"
        "print(\"stale pushes seen, every push applied, lead within the bound, accuracy above 0.75:\", ok)"),
    new_markdown_cell(
        "## Delay compensation under heterogeneity\n\n"
        "Now one of the three workers is made four times slower (`--simulate \"speed=1,1,0.25; clock=virtual; "
        "step=5ms\"`: its steps cost four times as much simulated time), so its gradients arrive stale. Three "
        "rules on the same engines, data, seed and optimizer (SGD, momentum 0.9), and the same order of "
        "pushes for all three (it depends only on the simulated speeds):\n\n"
        "- `asgd`: the optimizer as compiled. Asynchrony adds momentum of its own, about tau/(tau+1).\n"
        "- `dc-asgd-a`: Zheng et al.'s delay compensation g + lambda_t g*g*(w - w_bak), lambda_t adaptive, "
        "no momentum.\n"
        "- `ddc-asgd`: the compensation, plus momentum and step size scaled by each push's measured delay: "
        "gamma = (tau_bar+1)/(tau+1) < 1 for a push staler than average, mu_t = max(0, mu - tau_bar/(tau_bar+1)) "
        "gamma."),
    new_code_cell(
        "TRAIN = '''\n"
        "model = build()\n"
        "model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),\n"
        "              loss=\"sparse_categorical_crossentropy\", metrics=[\"accuracy\"])\n"
        "history = model.fit(x, y, batch_size=64, epochs=1)\n"
        "'''\n"
        "compared = {}\n"
        "for rule in (\"asgd\", \"dc-asgd-a\", \"ddc-asgd\"):\n"
        "    get_ipython().run_cell_magic(\"distribute\", f'--strategy {rule} --workers 3 --seed 0 '\n"
        "                                 '--simulate \"speed=1,1,0.25; clock=virtual; step=5ms\"', TRAIN)\n"
        "    pushes = nbdist.last_run.push_records\n"
        "    slow = [p for p in pushes if p[\"worker\"] == 2]\n"
        "    compared[rule] = {\n"
        "        \"test accuracy\": model.evaluate(x_test, y_test, verbose=0)[1],\n"
        "        \"slow worker's mean staleness\": statistics.mean(p[\"staleness\"] for p in slow),\n"
        "        \"fast workers' mean staleness\": statistics.mean(p[\"staleness\"] for p in pushes if p[\"worker\"] < 2),\n"
        "        \"slow worker's mean gamma\": statistics.mean(p[\"gamma\"] for p in slow) if slow[0][\"gamma\"] else None,\n"
        "        \"dropped\": sum(p[\"dropped\"] for p in pushes),\n"
        "    }"),
    new_code_cell(
        "columns = list(next(iter(compared.values())))\n"
        "print(f\"{'rule':<10}\" + \"\".join(f\"{c:>30}\" for c in columns))\n"
        "for rule, row in compared.items():\n"
        "    print(f\"{rule:<10}\" + \"\".join(f\"{'-' if v is None else round(v, 3):>30}\" for v in row.values()))"),
    new_markdown_cell(
        "One epoch on 20,000 samples is too short to rank the rules (`python -m nbdist.experiments compare` "
        "does that with seeds and error bars: see docs/results.md); what it shows is the mechanism: the slow "
        "worker's pushes are staler, and ddc-asgd gives them a smaller step. `asgd` with the optimizer's "
        "momentum 0.9 often diverges here (test accuracy 0.1): asynchrony adds its own momentum, and nbdist "
        "printed the effective momentum and a warning under that run."),
    new_code_cell(
        "# NBVAL_CHECK_OUTPUT\n"
        "ddc = compared[\"ddc-asgd\"]\n"
        "ok = (ddc[\"slow worker's mean staleness\"] > ddc[\"fast workers' mean staleness\"]\n"
        "      and ddc[\"slow worker's mean gamma\"] < 1 and ddc[\"test accuracy\"] > 0.5)\n"
        "assert ok, compared\n"
        "print(\"the slow worker is staler, ddc-asgd scales its pushes down and learns:\", ok)"),
    new_code_cell("%dist stop"),
]


def fashion_cnn_cell(limit: int, conv_layers: int):
    """A definition cell: the first `limit` Fashion-MNIST samples and a small CNN (16, then 32 filters)."""
    convs = "".join(f"        keras.layers.Conv2D({filters}, 3, activation=\"relu\"),\n"
                    "        keras.layers.MaxPooling2D(),\n" for filters in (16, 32)[:conv_layers])
    return new_code_cell(
        "%%distribute define\n"
        "import keras\n"
        "from nbdist.datasets import fashion_mnist\n\n"
        f"(x, y), (x_test, y_test) = fashion_mnist(limit={limit})\n"
        "x, x_test = x.astype(\"float32\")[..., None] / 255, x_test.astype(\"float32\")[..., None] / 255\n\n"
        "def build():\n"
        "    return keras.Sequential([\n"
        "        keras.Input((28, 28, 1)),\n"
        f"{convs}"
        "        keras.layers.Flatten(),\n"
        "        keras.layers.Dense(10, activation=\"softmax\"),\n"
        "    ])")


ASHL = [
    new_markdown_cell(
        "# ASHL: training on a heterogeneous cluster\n\n"
        "Four engines, made unequal on purpose with `--simulate`: compute speeds 1, 1, 0.5 and 0.25, links of "
        "1 Gbit/s, 1 Gbit/s, 200 Mbit/s and 50 Mbit/s. The run is on the **virtual clock** (`clock=virtual; "
        "step=2ms+70us/sample`): a step of batch b costs (2 ms + b x 70 us) / speed of simulated time and an "
        "exchange 2 x latency + bytes / bandwidth, nothing sleeps, and the parameter server applies pushes in "
        "simulated-time order, so the profile, the decisions and the accuracy below are the same on every run. "
        "On real hosts the flag is not needed: ASHL measures whatever the hosts are.\n\n"
        "`--strategy ashl` first **profiles** every worker (compute time at two batch sizes, push-sized round "
        "trips to the parameter server, within a quarter of a second), then **allocates**: batches that equalise step time, data shards in "
        "proportion, and a push period for a worker whose link cannot keep up. It trains **asynchronously** "
        "(AHL, the `ddc-asgd` rule, each push weighted by its samples) and **switches** to synchronous rounds "
        "(SHL) when the switch rule says so; each worker **compresses** its pushes when communication dominates "
        "its step. Every decision is an event with its reason."),
    new_code_cell("%load_ext nbdist\n%dist start -n 4"),
    fashion_cnn_cell(12000, conv_layers=2),
    new_code_cell(
        "%%distribute --strategy ashl --workers 4 --seed 0 --simulate \"speed=1,1,0.5,0.25; bandwidth=1g,1g,200m,50m; clock=virtual; step=2ms+70us/sample\"\n"
        "model = build()\n"
        "model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),\n"
        "              loss=\"sparse_categorical_crossentropy\", metrics=[\"accuracy\"])\n"
        "history = model.fit(x, y, batch_size=64, epochs=4, validation_data=(x_test, y_test))"),
    new_markdown_cell(
        "The profile table and the decisions were printed under the cell; they are also on the run "
        "(`nbdist.last_run.events`), and the dashboard shows them live. The slow workers get smaller batches "
        "and smaller data shards, so every worker finishes an epoch at about the same simulated time; the worker on the "
        "50 Mbit/s link pushes only every few steps (the mean gradient of the batches in between)."),
    new_code_cell(
        "import nbdist\n"
        "from nbdist.ashl.report import decisions, profile_table\n"
        "from nbdist.experiments import epoch_times  # virtual seconds from the run's start to each epoch's end\n"
        "run = nbdist.last_run\n"
        "print(profile_table(run))\n"
        "print(\"\\n\".join(decisions(run)))\n"
        "allocated = run.events_of(\"allocated\")[0]\n"
        "switched = run.events_of(\"switch_phase\")\n"
        "compression = run.events_of(\"compression\")\n"
        "ashl_accuracy = model.evaluate(x_test, y_test, verbose=0)[1]\n"
        "ashl_seconds = epoch_times(run, run.started_at)[-1]\n"
        "print(f\"ASHL: {ashl_seconds:.1f} virtual s, test accuracy {ashl_accuracy:.4f}\")"),
    new_code_cell(
        "# NBVAL_CHECK_OUTPUT\n"
        "# the virtual clock's profile is the simulated cost exactly, so the allocation is the same every run\n"
        "batches = allocated[\"batches\"]\n"
        "ok = (batches == [114, 114, 20, 8] and len(switched) == 1 and bool(switched[0][\"reason\"])\n"
        "      and ashl_accuracy > 0.7)\n"
        "assert ok, (batches, switched, ashl_accuracy)\n"
        "print(\"batches\", batches, \"- one phase switch with its reason, accuracy above 0.7:\", ok)"),
    new_markdown_cell(
        "For contrast, the same cell with synchronous SGD on the parameter server (`ssgd`): every step waits "
        "for the slowest worker. `python -m nbdist.experiments compare --strategies ashl,adsp,ssgd,hfdt,asgd "
        "...` measures this properly, with seeds and time to a target accuracy (docs/results.md)."),
    new_code_cell(
        "%%distribute --strategy ssgd --workers 4 --seed 0 --simulate \"speed=1,1,0.5,0.25; bandwidth=1g,1g,200m,50m; clock=virtual; step=2ms+70us/sample\"\n"
        "model = build()\n"
        "model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),\n"
        "              loss=\"sparse_categorical_crossentropy\", metrics=[\"accuracy\"])\n"
        "history = model.fit(x, y, batch_size=64, epochs=4, validation_data=(x_test, y_test))"),
    new_code_cell(
        "ssgd_seconds = epoch_times(nbdist.last_run, nbdist.last_run.started_at)[-1]\n"
        "print(f\"ssgd: {ssgd_seconds:.1f} virtual s, test accuracy {model.evaluate(x_test, y_test, verbose=0)[1]:.4f}\")\n"
        "print(f\"ashl: {ashl_seconds:.1f} virtual s, test accuracy {ashl_accuracy:.4f}\")"),
    new_code_cell("%dist stop"),
]


MULTI_HOST = [
    new_markdown_cell(
        "# A cluster started outside the notebook\n\n"
        "On real hosts the cluster is started once, from a shell, and notebooks connect to it. With "
        "ipyparallel's launchers that is one command on the head node:\n\n"
        "```bash\n"
        "ipcluster start --profile=nbdist-multihost -n 8 --engines=ssh    # or mpi, slurm, pbs, ...\n"
        "```\n\n"
        "(or `ipcontroller` there and `ipengine` on each host: README.md, \"Multi-host\"). When this notebook "
        "runs under `make test`, the test suite starts `ipcluster start --profile=nbdist-multihost -n 2` on "
        "this machine first (notebooks/conftest.py). Engines need nbdist installed, in the notebook's version."),
    new_code_cell("%load_ext nbdist\nimport nbdist\n%dist connect --profile nbdist-multihost"),
    new_markdown_cell("What nbdist sees of each engine: its host, process, CPUs, the GPUs TensorFlow finds there, "
                      "the versions of TensorFlow, Keras and Horovod, and whether it is idle."),
    new_code_cell("%dist status"),
    fashion_cnn_cell(12000, conv_layers=1),
    new_markdown_cell("Synchronous training across the engines with Horovod's ring-allreduce (`hfdt`): the "
                      "rendezvous runs in this kernel, on its address towards the controller."),
    new_code_cell(
        "%%distribute --strategy hfdt --workers 2 --seed 0\n"
        "model = build()\n"
        "model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),\n"
        "              loss=\"sparse_categorical_crossentropy\", metrics=[\"accuracy\"])\n"
        "history = model.fit(x, y, batch_size=64, epochs=2, validation_data=(x_test, y_test))"),
    new_code_cell("hfdt_accuracy = model.evaluate(x_test, y_test, verbose=0)[1]\n"
                  "print(f\"hfdt: test accuracy {hfdt_accuracy:.4f}\")"),
    new_markdown_cell("Asynchronous training through the parameter server with dynamic delay compensation "
                      "(`ddc-asgd`): the shards run on this host and listen on its address towards the controller; "
                      "every message is signed with a key drawn for this run."),
    new_code_cell(
        "%%distribute --strategy ddc-asgd --workers 2 --seed 0\n"
        "model = build()\n"
        "model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),\n"
        "              loss=\"sparse_categorical_crossentropy\", metrics=[\"accuracy\"])\n"
        "history = model.fit(x, y, batch_size=64, epochs=2, validation_data=(x_test, y_test))"),
    new_code_cell("ddc_accuracy = model.evaluate(x_test, y_test, verbose=0)[1]\n"
                  "run = nbdist.last_run\n"
                  "print(f\"ddc-asgd: test accuracy {ddc_accuracy:.4f}; PS shard at {run.ps[0]['address']}; \"\n"
                  "      f\"{run.ps[0]['counts']['applied']} pushes applied\")"),
    new_code_cell(
        "# NBVAL_CHECK_OUTPUT\n"
        "ok = hfdt_accuracy > 0.7 and ddc_accuracy > 0.7 and run.ps[0][\"counts\"][\"rejected\"] == 0\n"
        "assert ok, (hfdt_accuracy, ddc_accuracy, run.ps[0][\"counts\"])\n"
        "print(\"both strategies trained on the connected cluster:\", ok)"),
    new_markdown_cell("`%dist stop` only disconnects: the cluster was started outside nbdist and keeps running "
                      "for the next notebook (`ipcluster stop --profile=nbdist-multihost` ends it)."),
    new_code_cell("%dist stop"),
]


# the unmarked notebook's training cell, run twice (the second time nothing is sent)
NO_MARKS_TRAIN = (
    "%%distribute --strategy nfdt --workers 2 --seed 0\n"
    "model = build()\n"
    "model.compile(optimizer=keras.optimizers.SGD(0.05), loss=\"sparse_categorical_crossentropy\",\n"
    "              metrics=[\"accuracy\"])\n"
    "history = model.fit(x, y, batch_size=64, epochs=2, validation_data=(x_test, y_test))")

NO_MARKS = [
    new_markdown_cell(
        "# A notebook with no marks\n\n"
        "The quickstart marks its definition cells with `%%distribute define`. They are optional: before a training "
        "cell runs, nbdist finds what it uses that the engines lack (modules, the notebook's functions and classes, "
        "data) and brings it, each worker only its shard of the arrays `fit` trains on. Marks still buy something: "
        "a marked cell runs on the engines themselves, so data they can load there never crosses the network."),
    new_code_cell("%load_ext nbdist\n%dist start -n 2"),
    new_code_cell("import keras\nfrom nbdist.datasets import fashion_mnist"),
    new_code_cell(
        "(x, y), (x_test, y_test) = fashion_mnist(limit=12000)\n"
        "x, x_test = x.astype(\"float32\") / 255, x_test.astype(\"float32\") / 255"),
    new_code_cell(
        "def build(hidden=128):\n"
        "    return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(),\n"
        "                             keras.layers.Dense(hidden, activation=\"relu\"),\n"
        "                             keras.layers.Dense(10, activation=\"softmax\")])"),
    new_markdown_cell("An ordinary training cell, under `%%distribute`: two workers, asynchronous, through the "
                      "parameter server."),
    new_code_cell(NO_MARKS_TRAIN),
    new_code_cell(
        "import nbdist\n"
        "brought = nbdist.last_run.sent[\"brought\"]\n"
        "print(\"brought:\", sorted(brought[\"names\"]), \"- one shard per worker:\", sorted(brought[\"sharded\"]))\n"
        "accuracy = model.evaluate(x_test, y_test, verbose=0)[1]\n"
        "assert accuracy > 0.75, accuracy"),
    new_markdown_cell("Run the same cell again: the engines hold everything it uses, so nothing is sent."),
    new_code_cell(NO_MARKS_TRAIN),
    new_code_cell(
        "# NBVAL_CHECK_OUTPUT\n"
        "print(\"bytes of data sent by the re-run:\", nbdist.last_run.sent[\"brought\"][\"data_bytes\"])"),
    new_code_cell("%dist stop"),
]


MODEL_PARALLEL = [
    new_markdown_cell(
        "# Model parallel: a model split in two\n\n"
        "When a model and its optimizer state do not fit on one engine, `--strategy pipeline` cuts it into "
        "consecutive stages, one engine each. Each stage holds only its layers' variables and optimizer slots; "
        "every batch is cut into micro-batches that flow through the stages (1F1B schedule), activations forward "
        "and their gradients back. The training cell is unchanged."),
    new_code_cell("%load_ext nbdist\n%dist start -n 2"),
    new_code_cell(
        "%%distribute define\n"
        "import keras\n"
        "from nbdist.datasets import fashion_mnist\n\n"
        "(x, y), (x_test, y_test) = fashion_mnist(limit=8000)\n"
        "x, x_test = x.reshape(len(x), -1).astype(\"float32\") / 255, x_test.reshape(len(x_test), -1).astype(\"float32\") / 255\n\n"
        "def build():\n"
        "    return keras.Sequential([\n"
        "        keras.Input((784,)),\n"
        "        keras.layers.Dense(512, activation=\"relu\", name=\"hidden_1\"),\n"
        "        keras.layers.Dense(512, activation=\"relu\", name=\"hidden_2\"),\n"
        "        keras.layers.Dense(256, activation=\"relu\", name=\"hidden_3\"),\n"
        "        keras.layers.Dense(10, activation=\"softmax\", name=\"classes\"),\n"
        "    ])"),
    new_markdown_cell("Two stages, 4 micro-batches per batch. `--split auto` times each layer's forward and backward on "
                      "stage 0 and cuts where the slower stage is fastest; the split is printed under the cell."),
    new_code_cell(
        "%%distribute --strategy pipeline --stages 2 --microbatches 4 --seed 0\n"
        "model = build()\n"
        "model.compile(optimizer=\"adam\", loss=\"sparse_categorical_crossentropy\", metrics=[\"accuracy\"])\n"
        "history = model.fit(x, y, batch_size=128, epochs=3, validation_split=0.1)"),
    new_markdown_cell("The notebook's `model` is the whole trained model, reassembled from the stages (its optimizer "
                      "state too), and `nbdist.last_run.plan` holds the split."),
    new_code_cell(
        "import nbdist\n"
        "plan = nbdist.last_run.plan\n"
        "for stage in plan[\"stages\"]:\n"
        "    print(f\"stage {stage['stage']}: {', '.join(stage['layers'])}, {stage['bytes'] / 1e6:.2f} MB of parameters, \"\n"
        "          f\"busy {stage['busy']:.0%} of its steps\")\n"
        "accuracy = model.evaluate(x_test, y_test, verbose=0)[1]\n"
        "assert accuracy > 0.75, accuracy\n"
        "assert len(plan[\"stages\"]) == 2 and len(model.optimizer.variables) > 2"),
    new_markdown_cell("The stages' timeline on the 1F1B schedule, from the measured stage times: where each stage "
                      "works (F: a micro-batch forward, B: its backward) and where it waits (the bubble, "
                      "(K-1)/(M+K-1) of the time with equal stages)."),
    new_code_cell(
        "import plotly.graph_objects as go\n"
        "from nbdist.pipeline import schedule\n"
        "costs = [s[\"cost_s\"] * 1e3 for s in plan[\"stages\"]]\n"
        "figure = go.Figure()\n"
        "for s, cost in enumerate(costs):  # a backward costs about twice a forward\n"
        "    timeline = schedule.simulate(\"1f1b\", 2, 4, forward_s=cost / 3, backward_s=2 * cost / 3)[\"steps\"][s]\n"
        "    for kind, m, start, end in timeline:\n"
        "        figure.add_bar(y=[f\"stage {s}\"], x=[end - start], base=[start], orientation=\"h\", showlegend=False,\n"
        "                       marker_color=\"#4c78a8\" if kind == \"F\" else \"#f58518\", text=f\"{kind}{m}\")\n"
        "figure.update_layout(barmode=\"overlay\", height=220, xaxis_title=\"ms into a batch (ideal links)\",\n"
        "                     title=f\"1F1B, 2 stages, 4 micro-batches: bubble {schedule.theoretical_bubble(2, 4):.0%} in theory\")\n"
        "figure"),
    new_code_cell("%dist stop"),
]


def write(path: Path, cells) -> None:
    notebook = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    for i, cell in enumerate(notebook.cells):
        cell.id = f"{path.stem}-{i}"  # stable ids: regenerating a notebook changes only what changed
    nbformat.validator.normalize(notebook)
    path.write_text(nbformat.writes(notebook) + "\n")


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent / "notebooks"
    write(root / "01-quickstart.ipynb", QUICKSTART)
    write(root / "02-hfdt.ipynb", HFDT)
    write(root / "03-async.ipynb", ASYNC)
    write(root / "04-ashl.ipynb", ASHL)
    write(root / "05-multi-host.ipynb", MULTI_HOST)
    write(root / "06-no-marks.ipynb", NO_MARKS)
    write(root / "07-model-parallel.ipynb", MODEL_PARALLEL)
