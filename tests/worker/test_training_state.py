"""The whole training state (:mod:`elastic.worker.state`): registered objects and the library's
part, composed, sent through the codec, and loaded into fresh objects."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils.data as tud
from torch.optim import lr_scheduler as schedulers

from elastic.worker.codec import assemble, decode_header, encode_state
from elastic.worker.data import ElasticLoader
from elastic.worker.errors import DataPlanError, StateTransferError, TrainingStateError
from elastic.worker.state import TrainingState

pytestmark = pytest.mark.needs_torch


def through_codec(state):
    """``state`` as a peer receives it."""
    encoded = encode_state(state, 1024)
    return assemble(decode_header(encoded.header), [chunk.clone() for chunk in encoded.chunks])


class Counter:
    """A program's own state: a gradient-accumulation counter."""

    def __init__(self) -> None:
        self.micro_steps = 0

    def state_dict(self):
        return {"micro_steps": self.micro_steps}

    def load_state_dict(self, state):
        self.micro_steps = state["micro_steps"]


def training(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    objects = {"model": model, "opt": opt, "sched": schedulers.OneCycleLR(opt, 0.1, total_steps=50),
               "scaler": torch.amp.GradScaler("cpu", growth_interval=2), "counter": Counter()}
    return objects


def train(objects, steps: int) -> None:
    model, opt, sched, scaler = objects["model"], objects["opt"], objects["sched"], objects["scaler"]
    for step in range(steps):
        torch.manual_seed(100 + step)
        opt.zero_grad()
        scaler.scale(model(torch.randn(5, 4)).pow(2).mean()).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        sched.step()
        objects["counter"].micro_steps += 2


def digest(objects) -> bytes:
    encoded = encode_state({name: obj.state_dict() for name, obj in objects.items()}, 1024)
    return encoded.header + b"".join(chunk.numpy().tobytes() for chunk in encoded.chunks)


def test_registered_objects_arrive_bit_for_bit_and_train_on_alike():
    source, joiner = training(0), training(1)
    train(source, 7)
    sent = TrainingState(source, None, None, seed=4)
    received = TrainingState(joiner, None, None, seed=0)
    step = received.apply(through_codec(sent.compose(7)), "the received state")
    assert step == 7 and received.seed == 4
    assert digest(joiner) == digest(source)
    assert joiner["sched"].get_last_lr() == source["sched"].get_last_lr()
    assert joiner["scaler"].get_scale() == source["scaler"].get_scale() != 65536.0
    train(source, 5)
    train(joiner, 5)
    assert digest(joiner) == digest(source)


SCHEDULERS = {
    "StepLR": lambda opt: schedulers.StepLR(opt, 3),
    "LambdaLR": lambda opt: schedulers.LambdaLR(opt, lambda epoch: 0.9**epoch),
    "MultiplicativeLR": lambda opt: schedulers.MultiplicativeLR(opt, lambda epoch: 0.9),
    "MultiStepLR": lambda opt: schedulers.MultiStepLR(opt, [2, 4, 4, 9]),
    "ConstantLR": lambda opt: schedulers.ConstantLR(opt),
    "LinearLR": lambda opt: schedulers.LinearLR(opt),
    "ExponentialLR": lambda opt: schedulers.ExponentialLR(opt, 0.9),
    "PolynomialLR": lambda opt: schedulers.PolynomialLR(opt),
    "CosineAnnealingLR": lambda opt: schedulers.CosineAnnealingLR(opt, 10),
    "CosineAnnealingWarmRestarts": lambda opt: schedulers.CosineAnnealingWarmRestarts(opt, 3),
    "CyclicLR": lambda opt: schedulers.CyclicLR(opt, 0.01, 0.1, step_size_up=3),
    "OneCycleLR": lambda opt: schedulers.OneCycleLR(opt, 0.1, total_steps=100),
    "ReduceLROnPlateau": lambda opt: schedulers.ReduceLROnPlateau(opt, patience=1),
    "SequentialLR": lambda opt: schedulers.SequentialLR(opt, [schedulers.LinearLR(opt), schedulers.ExponentialLR(opt, 0.9)], [3]),
    "ChainedScheduler": lambda opt: schedulers.ChainedScheduler([schedulers.LinearLR(opt), schedulers.ExponentialLR(opt, 0.9)]),
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_torch_lr_scheduler_travels_and_steps_on_alike(name):
    def make():
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1, momentum=0.9)
        return {"opt": opt, "sched": SCHEDULERS[name](opt)}

    def step(objects, times):
        for _ in range(times):
            objects["opt"].step()
            sched = objects["sched"]
            sched.step(1.0) if isinstance(sched, schedulers.ReduceLROnPlateau) else sched.step()

    warnings.simplefilter("ignore")  # torch's advice on the order of optimizer and scheduler steps
    source, joiner = make(), make()
    step(source, 5)
    TrainingState(joiner, None, None, 0).apply(through_codec(TrainingState(source, None, None, 0).compose(5)), "it")
    step(source, 7)
    step(joiner, 7)
    lrs = [group["lr"] for group in source["opt"].param_groups]
    assert [group["lr"] for group in joiner["opt"].param_groups] == lrs
    assert joiner["sched"].get_last_lr() == source["sched"].get_last_lr()


def test_a_programs_own_pair_is_the_user_part():
    kept = {}
    state = TrainingState(None, lambda: {"w": torch.ones(2)}, kept.update, seed=None)
    whole = state.compose(3)
    assert whole["library"] == {"step": 3, "seed": None, "data": None} and whole["user"]["w"].tolist() == [1, 1]
    assert state.apply(through_codec(whole), "it") == 3 and kept["w"].tolist() == [1, 1]


class Samples(tud.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        return index


def test_a_data_position_received_before_the_loader_is_known_waits_for_it():
    survivor, joiner = ElasticLoader(Samples(), 2, seed=7), ElasticLoader(Samples(), 2, seed=1)
    survivor.set_world(0, 2)
    for _ in range(3):
        survivor.next_step()
        survivor.commit()
    sending = TrainingState({}, None, None, 0)
    sending.attach(survivor)
    receiving = TrainingState({}, None, None, 0)
    receiving.apply(through_codec(sending.compose(3)), "the received state")  # the heal at start()
    assert receiving.compose(3)["library"]["data"] == survivor.state_dict()
    receiving.attach(joiner)  # run(data=joiner)
    assert joiner.position == survivor.position
    bad = sending.compose(3)
    bad["library"]["data"] = {"epoch": 0, "consumed": 99, "seed": 0}
    with pytest.raises(DataPlanError, match="past the end of the dataset"):
        receiving.apply(bad, "the received state")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((None, None, None), "one way"),
        (({}, dict, dict), "one way"),
        ((None, dict, None), "must both be callables"),
        (([torch.nn.Linear(1, 1)], None, None), "must map names to objects, not a list"),
        (({1: torch.nn.Linear(1, 1)}, None, None), "names must be strings, not 1"),
        (({"params": [torch.zeros(1)]}, None, None), r"'params' \(a list\) has no state_dict\(\) and load_state_dict\(\)"),
    ],
)
def test_a_malformed_registration_is_one_clear_error(args, message):
    with pytest.raises(TrainingStateError, match=message):
        TrainingState(*args, seed=0)


def test_a_state_that_does_not_fit_the_registration_is_one_clear_error():
    model = torch.nn.Linear(2, 1)
    state = TrainingState({"model": model}, None, None, 0)
    good = state.compose(1)
    cases = [
        ({"model": good["user"]["model"]}, "not a LiveTraining state"),
        ({**good, "library": {"step": 1}}, "no library state"),
        ({**good, "library": {**good["library"], "step": -1}}, "bad step -1"),
        ({**good, "library": {**good["library"], "seed": 1.5}}, "bad seed 1.5"),
        ({**good, "user": {"net": good["user"]["model"]}}, r"holds \['net'\], where this worker registered \['model'\]"),
        ({**good, "user": {"model": {"weight": torch.zeros(3, 3)}}}, r"'model' did not load from the checkpoint: RuntimeError"),
    ]
    for bad, message in cases:
        with pytest.raises(StateTransferError, match=message):
            state.apply(bad, "the checkpoint")
