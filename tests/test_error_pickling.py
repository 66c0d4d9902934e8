"""Every treeguard error crosses a process boundary whole: pickle (Ray
replicas and actors, multiprocessing, ``ProcessPoolExecutor``) gives back the
same class with every field, its text, its exit code and its hint, whatever
its ``__init__`` takes; and each class names, as its ``__module__``, a module
that holds it under its name (the public face that exports it)."""

from __future__ import annotations

import concurrent.futures
import copy
import importlib
import io
import multiprocessing
import pickle
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from subproc import run_python

import treeguard as tg

FACES = (
    "treeguard",
    "treeguard.bench",
    "treeguard.diagnose",
    "treeguard.export",
    "treeguard.provenance",
    "treeguard.serving",
    "treeguard.verify",
)
for _face in FACES:  # each face's errors (and the private ones they raise) are defined
    importlib.import_module(_face)

STORE = {"version": "v3", "context": "/srv/store", "hint": "see `treeguard store log`"}
SIGNED = {"fingerprint": "ab" * 32, **STORE}


def _with_text(cls: type[Any], *, text: str, fields: dict[str, str]) -> BaseException:
    return cls(text, **fields)  # type: ignore[no-any-return]


#: Each error class by name, and how one is built with realistic fields.
BUILD: dict[str, Callable[[type[Any]], BaseException]] = {
    "TreeguardError": lambda c: c("it failed", context="model.safetensors", hint="re-save it"),
    "TreeMismatchError": lambda c: c(
        [tg.Mismatch("['dense']['w']", "shape", (3, 4), (4, 3))],
        expected_from="spec.json",
        actual_from="the checkpoint",
        context="ckpt/",
        hint="transpose the kernel",
    ),
    "InvalidTreeError": lambda c: c(
        [("['w']", "a str leaf"), ("['b']", "a list leaf")], hint="filter it", context="m"
    ),
    "FormatError": lambda c: c("header is not JSON", context="m.safetensors", where="bytes 8-12"),
    "IntegrityError": lambda c: c("bytes differ", path="['w']", version="v2", hint="re-save"),
    "VerificationError": lambda c: c(
        failed=["finite"], evidence={"finite": ["['w'] 2 NaN"]}, context="mlp", hint="see it"
    ),
    "NonFiniteError": lambda c: c(
        "1 leaf holds NaN or Inf in the grads:",
        counts={"['w']": 2},
        state_counts={"['mu']['w']": 1},
        params={"w": (0.5, -1.0)},
        path="['w']",
        where="the grads",
        bundle="nan/000001-step7",
        bundle_error=tg.RecorderError("disk full", directory="nan", reason="ENOSPC"),
        hint="see the bundle",
    ),
    "RecorderError": lambda c: c("disk full", directory="nan/", reason="ENOSPC", hint="free it"),
    "TracedValueError": lambda c: c("a concrete check under jit", hint="call it outside jit"),
    "ConfigError": lambda c: c("no batch axis in the spec", hint="name one"),
    "ModelCodeError": lambda c: c(
        "importing m raised", target="m:model", stage="import", cause="SyntaxError", hint="fix m"
    ),
    "ModelExitError": lambda c: c("m called sys.exit(3)", target="m:model", stage="run", code=3),
    "RunInterruptedError": lambda c: c("interrupted at case 3", hint="run it again"),
    "DiagnosisError": lambda c: c("unknown candidate 'x'", hint="pass one of: a, b"),
    "ServingError": lambda c: c("replica 2 is unhealthy", status=503, hint="see its log"),
    "NonFiniteVersionError": lambda c: c("v2", {"['w']": 1}, {"['w']": "bf16"}, "['w']: 1 value"),
    "Unavailable": lambda c: c("the batcher stopped", hint="retry on another replica"),
    "CompiledUnderForbid": lambda c: c("batch 7 compiled f32[8,3]", batch=7),
    "InvalidRequestError": lambda c: c("['x']: shape (2,) not (3,)", status=422, reason="shape"),
    "ExportError": lambda c: c("a host callback", model="mlp", context="export", hint="drop it"),
    "ExportValidationError": lambda c: c(
        "outputs differ by 0.5", model="mlp", case="ones", path="['y']", hint="check it"
    ),
    "ArtifactError": lambda c: c("jax 0.4.1 wrote it", version="v2", field="jax", hint="re-export"),
    "BenchError": lambda c: c("no benchmark in base.json", hint="pass a result of `bench run`"),
    "MachineMismatchError": lambda c: c([("cpu", "EPYC", "Xeon"), ("cores", 8, 16)]),
    **{  # the store's errors, and the signatures' (which also name a key)
        name: partial(_with_text, text=text, fields=fields)
        for fields, texts in (
            (
                STORE,
                {
                    "StoreError": "version v3 is rejected",
                    "NotAStoreError": "no STORE.json",
                    "UnknownVersionError": "no version v3",
                    "RetiredVersionError": "gc retired v3",
                    "DanglingPointerError": "the pointer names v3",
                    "SignatureError": "the verdict of v3 is unsigned",
                    "ConflictError": "another promote won",
                    "StorageError": "PUT timed out",
                    "Contradicted": "its answer was a 404, its HEAD 1,024 bytes",
                },
            ),
            (
                SIGNED,
                {
                    "ProvenanceError": "a signature was refused",
                    "MissingSignatureError": "v3 is unsigned",
                    "BadSignatureError": "the signature does not verify",
                    "UntrustedKeyError": "no trust list holds the key",
                    "RevokedKeyError": "signed by a revoked key",
                },
            ),
        )
        for name, text in texts.items()
    },
    "SignedDigestError": lambda c: c("bytes changed", names=("w: digest",), **SIGNED),
    "KeyFileError": lambda c: c("not a PEM EC key", path="keys/a.pem", hint="use P-256"),
}


def _subclasses(cls: type[BaseException]) -> Iterator[type[BaseException]]:
    for sub in cls.__subclasses__():
        if sub.__module__.split(".")[0] == "treeguard":  # not a test's own subclass
            yield sub
            yield from _subclasses(sub)


ERRORS: list[type[BaseException]] = sorted(
    {tg.TreeguardError, *_subclasses(tg.TreeguardError)}, key=lambda c: c.__name__
)
CLASSES: list[type[BaseException]] = [*ERRORS, tg.UnverifiedWeightsWarning]
BY_NAME = {c.__name__: c for c in ERRORS}  # the private and the face-only ones too


def _fields(err: BaseException) -> dict[str, Any]:
    """The error's class, text, exit code and fields, with the errors it holds
    (a ``NonFiniteError``'s ``bundle_error``) compared the same way."""
    fields = {k: _fields(v) if isinstance(v, BaseException) else v for k, v in vars(err).items()}
    return {
        "class": type(err),
        "str": str(err),
        "args": err.args,
        "exit_code": getattr(err, "exit_code", None),
        **fields,
    }


def _built(cls: type[BaseException]) -> BaseException:
    err = BUILD[cls.__name__](cls)
    err.add_note("seen on replica 2")
    return err


def test_the_table_builds_every_error_class() -> None:
    assert sorted(BUILD) == sorted(c.__name__ for c in ERRORS), "add the new error to BUILD"
    assert len(ERRORS) > 30  # the walk found the hierarchy


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_an_error_comes_back_from_pickle_with_every_field(cls: type[BaseException]) -> None:
    err = _built(cls)
    for protocol in (2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
        back = pickle.loads(pickle.dumps(err, protocol=protocol))
        assert type(back) is cls
        assert _fields(back) == _fields(err)
        assert back.__notes__ == ["seen on replica 2"]
    assert _fields(copy.deepcopy(err)) == _fields(copy.copy(err)) == _fields(err)


def test_a_non_finite_error_keeps_its_hint_and_the_recorder_error_it_holds() -> None:
    err = _built(tg.NonFiniteError)
    back = pickle.loads(pickle.dumps(err))
    assert back.hint == "see the bundle" and back.exit_code == 1
    assert isinstance(back.bundle_error, tg.RecorderError)
    assert back.bundle_error.reason == "ENOSPC"
    assert str(back).splitlines()[-1] == "hint: see the bundle"


def test_the_unverified_weights_warning_comes_back_from_pickle() -> None:
    warning = tg.UnverifiedWeightsWarning("model.safetensors")
    back = pickle.loads(pickle.dumps(warning))
    assert (type(back), back.file, str(back)) == (type(warning), warning.file, str(warning))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_an_error_names_a_module_that_holds_it(cls: type[BaseException]) -> None:
    assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls
    exported_by = [
        face
        for face in FACES
        if cls.__name__ in importlib.import_module(face).__all__
        and getattr(importlib.import_module(face), cls.__name__) is cls
    ]
    if exported_by:  # a public error shows as the face that exports it
        assert cls.__module__ in exported_by
    else:  # a private one as the module it is defined in
        assert cls.__module__.startswith("treeguard._src.")


#: The errors only the command line (a model's failing code, Ctrl-C) or the
#: server (a version that is not finite) raise, and the face each is public in.
RAISED_BY_THE_CLI_OR_THE_SERVER = {
    "ModelCodeError": "treeguard",
    "ModelExitError": "treeguard",
    "RunInterruptedError": "treeguard",
    "NonFiniteVersionError": "treeguard.serving",
}


@pytest.mark.parametrize(("name", "face"), RAISED_BY_THE_CLI_OR_THE_SERVER.items())
def test_an_error_of_the_command_line_or_the_server_is_public(name: str, face: str) -> None:
    module = importlib.import_module(face)
    assert name in module.__all__ and getattr(module, name) is BY_NAME[name]
    # a traceback shows it as the face's, where a user finds it to catch it
    shown = traceback.format_exception_only(_built(BY_NAME[name]))[0]
    assert shown.startswith(f"{face}.{name}: ")


class ModelOwnError(tg.TreeguardError):
    """A user's subclass, outside treeguard: pickled as any class is."""

    def __init__(self, message: str, *, step: int) -> None:
        self.step = step
        super().__init__(message, hint="lower the learning rate")


def test_a_users_own_subclass_comes_back_from_pickle() -> None:
    err = ModelOwnError("loss diverged", step=12)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ModelOwnError and _fields(back) == _fields(err)


@pytest.mark.slow  # a spawned interpreter imports treeguard: about a second
def test_errors_cross_a_spawned_process_pool_both_ways() -> None:
    # the child unpickles each error in a fresh interpreter (no face imported
    # yet), copies it, and pickles the copies back
    errors = [
        _built(BY_NAME[name]) for name in ("ServingError", "ModelExitError", "NonFiniteError")
    ]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        back = pool.submit(copy.copy, errors).result()
    assert [_fields(e) for e in back] == [_fields(e) for e in errors]


#: A child without the ``sign`` extra: ``cryptography`` cannot be imported. It
#: unpickles the errors given (hex on argv), then pickles them back on stdout.
WITHOUT_CRYPTOGRAPHY = """
import pickle, sys
sys.modules["cryptography"] = None  # every import of it now fails
errors = pickle.loads(bytes.fromhex(sys.argv[1]))
print(pickle.dumps(errors).hex())
"""


def test_a_provenance_error_unpickles_where_cryptography_is_not_installed() -> None:
    errors = [_built(c) for c in ERRORS if c.__module__ == "treeguard.provenance"]
    assert len(errors) == 7  # the walk found them all
    done = run_python(WITHOUT_CRYPTOGRAPHY, pickle.dumps(errors).hex())
    assert done.returncode == 0, done.stderr[-2000:]
    back = pickle.loads(bytes.fromhex(done.stdout.strip()))
    assert [_fields(e) for e in back] == [_fields(e) for e in errors]


class _TreeguardsOnly(pickle.Unpickler):
    """How a process that takes treeguard's errors from peers it does not
    trust unpickles them: it finds treeguard's globals, and no other."""

    def find_class(self, module: str, name: str) -> Any:
        if module.partition(".")[0] != "treeguard":
            raise pickle.UnpicklingError(f"{module}.{name} is not treeguard's")
        return super().find_class(module, name)


def _only_treeguards(data: bytes) -> Any:
    return _TreeguardsOnly(io.BytesIO(data)).load()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_an_error_pickle_names_only_treeguards_globals(cls: type[BaseException]) -> None:
    err = _built(cls) if cls in ERRORS else cls("model.safetensors")
    back = _only_treeguards(pickle.dumps(err))
    assert type(back) is cls and _fields(back) == _fields(err)


class _Asking:
    """A crafted pickle: the errors' own rebuilder asked for ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        rebuild = tg.TreeguardError("x").__reduce__()[0]  # what every error pickle calls
        return rebuild, (self.target, (), {"root": "/etc", "pid": 1})


@pytest.mark.parametrize(
    "target",
    [
        "sched:scheduler",  # a class of another module, made without its __init__
        "no_such_module_anywhere:Error",  # never imported: the name alone is refused
        "subprocess:CalledProcessError",  # another module's exception
        "treeguard:ArtifactStore",  # treeguard's, but no exception
        "treeguard:StoreError.__init__",
        "treeguard._src.errors:FACES",
        "treeguard._src.serving.grpc_transport:DecodeError",  # another's, in treeguard's module
    ],
)
def test_the_rebuilder_makes_no_other_object_than_a_treeguard_error(target: str) -> None:
    # the rebuilder is a treeguard global, so an unpickler that admits only
    # treeguard's globals calls it: it must not import or make anything else
    with pytest.raises(
        pickle.UnpicklingError, match="names only treeguard.s own exception classes"
    ):
        _only_treeguards(pickle.dumps(_Asking(target)))


@pytest.mark.parametrize(
    ("old", "cls"),
    [
        ("treeguard._src.errors.run:ModelCodeError", tg.ModelCodeError),
        ("treeguard._src.errors.run:RunInterruptedError", tg.RunInterruptedError),
        ("treeguard._src.errors.run:NonFiniteVersionError", tg.serving.NonFiniteVersionError),
    ],
)
def test_a_pickle_an_older_build_wrote_naming_the_private_module_unpickles(
    old: str, cls: type[BaseException]
) -> None:
    # before these errors were public, their pickles named the module that defines them
    back = _only_treeguards(pickle.dumps(_Asking(old)))
    assert type(back) is cls and back.root == "/etc"  # type: ignore[attr-defined]
