"""``NAME[:KEY=VALUE,...]`` -> a verification rule instance.

Names: ``lossless``, ``exhaustive``, ``lenience:l=``, ``cos:lam=`` (alias ``interpolation``),
``diversed:f=module:function``, ``fuzzy:T=[,div=tv|kl|js]``,
``judge:j=module:function`` or ``judge:score=module:function,threshold=``,
``speccascade:p_base=``, ``typical:eps=[,delta=]``, and the matched baselines
``minp:p_base=``, ``eta:eps=[,delta=]``. Functions are imported by dotted path.
"""

from __future__ import annotations

import importlib

from specrank.decode.verify.lossy.collaborative import Diversed, FuzzySD, Interpolation, JudgeRelaxation, Lenience
from specrank.decode.verify.lossy.rules import Lossless, RuleError, TargetSampling, VerificationRule
from specrank.decode.verify.lossy.truncation import Eta, MinP, TruncatedLossless, TruncationAcceptance


def load_callable(path: str):
    """``package.module:function`` -> the function."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise RuleError(f"expected a function as module:name, got {path!r}")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise RuleError(f"cannot load {path!r}: {err}") from None
    if not callable(found):
        raise RuleError(f"{path!r} is not callable")
    return found


def _number(params: dict, key: str) -> float:
    if key not in params:
        raise RuleError(f"missing parameter {key}=")
    try:
        return float(params.pop(key))
    except ValueError:
        raise RuleError(f"parameter {key} must be a number") from None


def _eta(params):
    delta = _number(params, "delta") if "delta" in params else None
    return Eta(_number(params, "eps"), delta)


def _judge(params):
    if "j" in params:
        return JudgeRelaxation(judge=load_callable(params.pop("j")))
    if "score" not in params:
        raise RuleError("judge needs j=module:function or score=module:function,threshold=")
    score = load_callable(params.pop("score"))
    return JudgeRelaxation(score=score, threshold=_number(params, "threshold"))


def _diversed(params):
    if "f" not in params:
        raise RuleError("missing parameter f=module:function")
    path = params.pop("f")
    return Diversed(load_callable(path), label=path)


BUILDERS = {
    "lossless": lambda params: Lossless(),
    "exhaustive": lambda params: TargetSampling(),
    "lenience": lambda params: Lenience(_number(params, "l")),
    "cos": lambda params: Interpolation(_number(params, "lam")),
    "interpolation": lambda params: Interpolation(_number(params, "lam")),
    "diversed": _diversed,
    "fuzzy": lambda params: FuzzySD(_number(params, "T"), params.pop("div", "tv")),
    "judge": _judge,
    "speccascade": lambda params: TruncationAcceptance(MinP(_number(params, "p_base"))),
    "typical": lambda params: TruncationAcceptance(_eta(params)),
    "minp": lambda params: TruncatedLossless(MinP(_number(params, "p_base"))),
    "eta": lambda params: TruncatedLossless(_eta(params)),
}


def parse_verification_rule(text: str) -> VerificationRule:
    """A rule from ``NAME[:KEY=VALUE,...]``, e.g. ``"lenience:l=0.5"``."""
    name, _, body = text.strip().partition(":")
    if name not in BUILDERS:
        raise RuleError(f"unknown verification rule {name!r} (one of {', '.join(BUILDERS)})")
    params = {}
    for item in filter(None, body.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise RuleError(f"verifier parameter {item!r} is not KEY=VALUE")
        params[key.strip()] = value.strip()
    try:
        rule = BUILDERS[name](params)
    except RuleError as exc:  # a builder's message names the parameter; this names the whole spec
        raise RuleError(f"verifier {text.strip()!r}: {exc}") from None
    if params:
        raise RuleError(f"verifier {name!r} takes no parameter {', '.join(params)}")
    return rule
