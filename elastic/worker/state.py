"""The whole training state: what a heal sends to a rank that is behind, and what a whole-job
checkpoint saves.

It is composed of two parts::

    {"user":    {name: obj.state_dict(), ...},          # what the program registered
     "library": {"step": s, "seed": seed, "data": position or None}}

The program registers objects by name (a model, an optimizer, an LR scheduler, a GradScaler,
anything with ``state_dict()`` and ``load_state_dict()``), or gives one ``state_dict`` /
``load_state_dict`` pair of its own, whose value is then the ``"user"`` part. The library's part
is the step (the mark; a heal moves it by itself, so only a checkpoint's is loaded), the seed the
random generators are derived from (:mod:`elastic.worker.rng`), and the data position of the
:class:`~elastic.worker.data.ElasticLoader` the steps run on. A position that arrives before
the loader is known (the heal at ``start()``) waits for it.

Values travel through :mod:`elastic.worker.codec`: tensors, numbers, strings, ``None``, lists,
tuples and dicts (never pickled). Every LR scheduler of ``torch.optim.lr_scheduler`` and
``GradScaler`` fit; a ``LambdaLR``'s lambdas are not state (torch leaves functions out of its
``state_dict``: the receiver keeps its own), and ``MultiStepLR``'s milestones come back as a
dict (its ``step()`` reads them alike).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

from elastic.worker.errors import StateTransferError, TrainingStateError

__all__ = ["Stateful", "TrainingState"]


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class TrainingState:
    """The registered objects (or the program's pair of callables) and the library's state.

    Args:
        registered: name → object with ``state_dict()`` and ``load_state_dict()``; or ``None``.
        state_dict, load_state_dict: the program's own pair; or ``None``. Exactly one of the two
            ways is given.
        seed: the seed of the random generators (``LiveOptions.seed``), until a heal brings the
            job's.

    Raises (on construction):
        TrainingStateError: both ways or neither are given, a name is not a string, or an object
            lacks ``state_dict()`` or ``load_state_dict()``; the message names it.
    """

    def __init__(self, registered: Mapping[str, Stateful] | None, state_dict: Callable[[], Any] | None,
                 load_state_dict: Callable[[Any], Any] | None, seed: int | None) -> None:
        pair = (state_dict, load_state_dict)
        if (registered is None) == (pair == (None, None)):
            raise TrainingStateError("Give LiveTraining the training state one way: state={name: object} "
                                     "(objects with state_dict() and load_state_dict()), or a state_dict, "
                                     "load_state_dict pair of callables.")
        if registered is None and not all(callable(function) for function in pair):
            raise TrainingStateError("LiveTraining's state_dict and load_state_dict must both be callables.")
        self._registered = _check_registered(registered) if registered is not None else None
        self._pair = pair
        self.seed = seed
        self._loader: Stateful | None = None
        self._pending: Any = None  # a data position received before the loader was attached

    def attach(self, loader: Stateful) -> None:
        """Carry ``loader``'s position from now on; it takes a position that arrived before."""
        if loader is not self._loader:
            if self._pending is not None:
                loader.load_state_dict(self._pending)
                self._pending = None
            self._loader = loader

    def compose(self, step: int) -> dict[str, Any]:
        """The whole state at step ``step``."""
        if self._registered is None:
            user = self._pair[0]()
        else:
            user = {name: obj.state_dict() for name, obj in self._registered.items()}
        data = self._loader.state_dict() if self._loader is not None else self._pending
        return {"user": user, "library": {"step": step, "seed": self.seed, "data": data}}

    def apply(self, state: Any, what: str) -> int:
        """Load ``state`` (what :meth:`compose` gave, from a peer or a checkpoint, named ``what``
        in errors); returns its step.

        Raises:
            StateTransferError: ``state`` is not such a state, names other objects than the
                registered ones, or an object refused its part (the message names it).
            DataPlanError: its data position does not fit the loader's dataset.
        """
        user, library = _split(state, what)
        if self._registered is None:
            _load(self._pair[1], user, what, "the state")
        else:
            if not isinstance(user, dict) or set(user) != set(self._registered):
                names = sorted(map(str, user)) if isinstance(user, dict) else type(user).__name__
                raise StateTransferError(f"{what} holds {names!s:.200}, where this worker registered "
                                         f"{sorted(self._registered)}: do all ranks register the same objects?")
            for name, obj in self._registered.items():
                _load(obj.load_state_dict, user[name], what, repr(name))
        self.seed = library["seed"]
        data = library["data"]
        if data is not None:
            if self._loader is not None:
                self._loader.load_state_dict(data)
            else:
                self._pending = data
        return library["step"]


def _check_registered(registered: Any) -> dict[str, Stateful]:
    if not isinstance(registered, Mapping):
        raise TrainingStateError(f"LiveTraining's state must map names to objects, not a {type(registered).__name__}.")
    for name, obj in registered.items():
        if not isinstance(name, str):
            raise TrainingStateError(f"LiveTraining's state names must be strings, not {name!r:.40}.")
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TrainingStateError(f"LiveTraining's state {name!r} (a {type(obj).__name__}) has no state_dict() and "
                                     "load_state_dict(): register the module, optimizer, scheduler or scaler itself, "
                                     "or an object of your own that has both.")
    return dict(registered)


def _split(state: Any, what: str) -> tuple[Any, dict[str, Any]]:
    """The user's part and the library's of a whole state, the library's checked."""
    if not isinstance(state, dict) or set(state) != {"user", "library"}:
        raise StateTransferError(f"{what} is not a LiveTraining state (a dict of 'user' and 'library').")
    library = state["library"]
    if not isinstance(library, dict) or set(library) != {"step", "seed", "data"}:
        raise StateTransferError(f"{what} has no library state of 'step', 'seed' and 'data'.")
    step, seed, data = library["step"], library["seed"], library["data"]
    if type(step) is not int or step < 0:
        raise StateTransferError(f"{what} has a bad step {step!r:.40}.")
    if seed is not None and type(seed) is not int:
        raise StateTransferError(f"{what} has a bad seed {seed!r:.40}.")
    if data is not None and not isinstance(data, dict):
        raise StateTransferError(f"{what} has a bad data position {data!r:.80}.")
    return state["user"], library


def _load(load: Callable[[Any], Any], part: Any, what: str, name: str) -> None:
    try:
        load(part)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError) as error:
        raise StateTransferError(f"{name} did not load from {what}: {type(error).__name__}: {error}") from error
