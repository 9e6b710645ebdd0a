"""The dashboard's live controls, labelled in words, each enabled only when the run's strategy honours it."""

from __future__ import annotations

import ipywidgets as widgets

# the widgets a Dashboard exposes by these names
WIDGETS = ("pause_button", "resume_button", "stop_button", "switch_button", "lr", "lr_button", "staleness",
           "staleness_button", "evict_choice", "evict_button", "ack")


class Controls:
    """Buttons and inputs; `act(action, value)` is called when one is used."""

    def __init__(self, workers: list[int], honoured: tuple[str, ...], act):
        wide = widgets.Layout(width="auto")
        self.ack = widgets.HTML("")
        self.pause_button = widgets.Button(description="Pause", icon="pause",
                                           tooltip="hold training between two steps; the weights stay as they are")
        self.resume_button = widgets.Button(description="Resume", icon="play", tooltip="go on after a pause")
        self.stop_button = widgets.Button(description="Stop", icon="stop", button_style="warning",
                                          tooltip="end training gracefully: weights kept, History closed")
        self.switch_button = widgets.Button(description="Switch phase now", tooltip="ASHL: leave the asynchronous "
                                            "phase for the synchronous one now, whatever the switch rule says")
        self.lr = widgets.BoundedFloatText(value=1.0, min=0.01, max=100.0, step=0.1, description="learning rate ×",
                                           style={"description_width": "initial"}, layout=widgets.Layout(width="210px"),
                                           tooltip="multiply the cell's learning rate by this factor from now on")
        self.lr_button = widgets.Button(description="Set learning rate", layout=wide,
                                        tooltip="apply the learning-rate factor")
        self.staleness = widgets.IntText(value=-1, description="staleness bound (-1: none)",
                                         style={"description_width": "initial"}, layout=widgets.Layout(width="230px"),
                                         tooltip="the most steps a worker may lead the slowest one by; -1 for none")
        self.staleness_button = widgets.Button(description="Set bound", tooltip="apply the staleness bound")
        self.evict_choice = widgets.Dropdown(options=[(f"worker {k}", k) for k in workers],
                                             layout=widgets.Layout(width="120px"), tooltip="the worker to evict")
        self.evict_button = widgets.Button(description="Evict", button_style="danger",
                                           tooltip="end this worker's part: its fit stops, the others go on")
        self.pause_button.on_click(lambda _: act("pause"))
        self.resume_button.on_click(lambda _: act("resume"))
        self.stop_button.on_click(lambda _: act("stop"))
        self.switch_button.on_click(lambda _: act("switch_phase"))
        self.lr_button.on_click(lambda _: act("lr_scale", float(self.lr.value)))
        self.staleness_button.on_click(
            lambda _: act("max_staleness", None if self.staleness.value < 0 else int(self.staleness.value)))
        self.evict_button.on_click(lambda _: act("evict", int(self.evict_choice.value)))
        for action, parts in (("pause", [self.pause_button]), ("resume", [self.resume_button]),
                              ("stop", [self.stop_button]), ("switch_phase", [self.switch_button]),
                              ("lr_scale", [self.lr, self.lr_button]),
                              ("max_staleness", [self.staleness, self.staleness_button]),
                              ("evict", [self.evict_choice, self.evict_button])):
            for part in parts:
                part.disabled = action not in honoured
        self.box = widgets.VBox([
            widgets.HBox([self.pause_button, self.resume_button, self.stop_button, self.switch_button]),
            widgets.HBox([self.lr, self.lr_button, self.staleness, self.staleness_button, self.evict_choice,
                          self.evict_button]),
        ])
