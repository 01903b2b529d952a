"""Tree forms of one-position rules as tree verifiers (lossy verification, arXiv 2607.26627, App. G.2-G.4) in the tree
decoder."""

import copy

import numpy as np
import pytest
import torch
from verify_helpers import chi_square_pvalue, one_thread  # noqa: F401 (autouse fixture)

from specrank.decode.loading.standalone import CausalLMDrafter
from specrank.decode.config import DecodeConfig
from specrank.decode.runs.recorder import record_prompt as decode_prompt
from specrank.decode.loading.target_passes import Target
from specrank.decode.core import PoolShape
from specrank.decode.verify import VerifyTree
from specrank.decode.verify.lossy.adapters import TreeRuleVerifier, path_rows
from specrank.decode.verify.lossy.parse import parse_verification_rule
from specrank.decode.verify.lossy.rules import RuleError
from specrank.decode.verify.lossy.tree import sample_tree, tree_form, tree_law
from specrank.testing import tiny_llama, tiny_tokenizer

V = 6
TOKEN = np.array([3, 1, 4, 2, 0, 5, 1])  # tree of test_verify_tree: rows 0..7
PARENT = np.array([0, 0, 0, 1, 1, 4, 3])
POOL_INDEX = np.array([10, 11, 12, 20, 21, 30, 22])
PROMPT = [2, 5, 7, 16, 25, 19, 3, 2, 6]
DRAWS = 600


def logits(seed):
    return torch.randn(len(TOKEN) + 1, V, generator=torch.Generator().manual_seed(seed)) * 1.5


def outcomes(verifier, rows, seed):
    """Cells ``end row * V + continuation`` of repeated verifications, read back from pool indices."""
    tree = VerifyTree(TOKEN, PARENT, POOL_INDEX, np.full(len(TOKEN), 0.5))
    row_of = {int(p): i + 1 for i, p in enumerate(POOL_INDEX)}
    gen = torch.Generator().manual_seed(seed)
    cells = []
    for _ in range(DRAWS):
        accepted, token = verifier.verify(tree, rows, gen)
        end = row_of[int(accepted[-1])] if len(accepted) else 0
        assert list(accepted) == [POOL_INDEX[r - 1] for r in path_rows(PARENT, end)[1:]]
        cells.append(end * V + token)
    return torch.tensor(cells)


@pytest.mark.parametrize("spec", ["lossless", "speccascade:p_base=0.3", "typical:eps=0.2,delta=0.5", "minp:p_base=0.3"])
def test_verifier_replays_tree_traversal(spec):
    """Same generator stream: the verifier emits exactly the traversal of the rule's tree form at T."""
    rule, rows = parse_verification_rule(spec), logits(1)
    probs = torch.softmax(rows.double() / 0.8, -1)
    tree = VerifyTree(TOKEN, PARENT, POOL_INDEX, np.full(len(TOKEN), 0.5))
    verifier = TreeRuleVerifier(rule, temperature=0.8)
    for seed in range(40):
        accepted, token = verifier.verify(tree, rows, torch.Generator().manual_seed(seed))
        end, cont, count = sample_tree(tree_form(rule), TOKEN, PARENT, probs, 1, torch.Generator().manual_seed(seed))
        assert list(accepted) == [POOL_INDEX[r - 1] for r in path_rows(PARENT, int(end[0]))[1:]]
        assert token == int(cont[0]) and len(accepted) == int(count[0])
    assert len(verifier.take()) == 40 and verifier.take() == []


def test_verifier_draws_follow_the_tree_law():
    """Chi-square against the closed-form tree law, with the lossless law as a negative control."""
    rule, rows = parse_verification_rule("speccascade:p_base=0.3"), logits(1)
    probs = torch.softmax(rows.double() / 0.8, -1)
    verifier = TreeRuleVerifier(rule, temperature=0.8)
    cells = outcomes(verifier, rows, 2)
    law = tree_law(tree_form(rule), TOKEN, PARENT, probs)
    assert chi_square_pvalue(cells, law.outcome) > 1e-4
    assert all(r["expected_accepted"] == pytest.approx(float(law.block_efficiency)) for r in verifier.take()[:5])
    wrong = tree_law(tree_form(parse_verification_rule("lossless")), TOKEN, PARENT, probs).outcome.reshape(-1)
    assert chi_square_pvalue(cells, wrong) < 1e-6


@pytest.mark.parametrize("spec", ["lenience:l=0.5", "cos:lam=0.5", "fuzzy:T=0.3"])
def test_rules_without_tree_form_are_refused(spec):
    with pytest.raises(RuleError, match="no tree form.*--speculation chain"):
        TreeRuleVerifier(parse_verification_rule(spec))


def test_diagnostics_along_the_emitted_path():
    rows = logits(4)
    rows[0] = torch.tensor([0.0, 1.0, 0.0, 1.2, 0.0, 0.0])  # root children 3 and 1 both allowed at p_base 0.3
    probs = torch.softmax(rows.double(), -1)
    tree = VerifyTree(TOKEN, PARENT, POOL_INDEX, np.full(len(TOKEN), 0.5))
    gen = torch.Generator().manual_seed(0)
    lossless, cascade = TreeRuleVerifier(parse_verification_rule("lossless"), 1.0), TreeRuleVerifier(
        parse_verification_rule("speccascade:p_base=0.3"), 1.0)
    for _ in range(30):
        lossless.verify(tree, rows, gen)
        cascade.verify(tree, rows, gen)
    for r in lossless.take():  # lossless emits the target row at every reached row
        assert len(r["token"]) == int(r["accepted"].sum()) + 1 and not r["accepted"][-1]
        assert np.abs(r["tv"]).max() < 1e-12 and np.isnan(r["tv_truncated"]).all()
    cas = cascade.take()
    law = tree_law(tree_form(parse_verification_rule("speccascade:p_base=0.3")), TOKEN, PARENT, probs)
    assert cas[0]["acceptance"][0] == pytest.approx(float(law.position_acceptance[0]))
    assert max(float(r["tv_truncated"][0]) for r in cas) > 1e-3  # the first allowed child is kept outright


def test_tree_decoder_with_rule_verifiers_greedy_equals_target_greedy():
    target = Target(tiny_llama(0), tiny_tokenizer(128))
    draft = copy.deepcopy(target.model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05 * p.std())
    drafter = CausalLMDrafter(draft, 128)
    config = DecodeConfig(PoolShape(3, 4, 3), budget=8, extra=0, max_new_tokens=16)
    with torch.no_grad():
        ref = target.model.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False)[0, len(PROMPT):]
    for spec in ("lossless", "speccascade:p_base=0.5"):  # greedy: the allowed set is the argmax alone
        verifier = TreeRuleVerifier(parse_verification_rule(spec), 0.0)
        out, records = decode_prompt(target, drafter, PROMPT, config, verifier=verifier)
        assert out == ref.tolist()
        rounds = verifier.take()
        assert [len(r["token"]) for r in rounds] == [rec["accepted"] + 1 for rec in records]
        assert sum(rec["accepted"] for rec in records) >= 3
