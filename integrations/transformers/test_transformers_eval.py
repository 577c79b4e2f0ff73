"""The evaluation loop is watched on its own, beside training: outputs kept across evaluations are
one leak, the training session's (issue 40: one leak, one verdict, judged at the run's pace from
what each evaluation leaves), with their holder; the evaluation loop's own session judges what
happens inside an evaluation and draws no leak verdict of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_helpers import EvalLeakTrainer, Tokens, make_args, tiny_bert

from memwatch import MemWatchWarning
from memwatch.analysis.beliefs import state_of
from memwatch.integrations.transformers import MemWatchCallback


@pytest.mark.fresh_process
def test_outputs_kept_across_evaluations_are_one_training_leak(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False, total_steps=10_000_000)
    args = make_args(tmp_path, num_train_epochs=6, eval_strategy="epoch", logging_steps=50)
    trainer = EvalLeakTrainer(tiny_bert(hidden_states=True), args, train_dataset=Tokens(200),
                              eval_dataset=Tokens(8 * 40), callbacks=[cb])
    with pytest.warns(MemWatchWarning) as caught:
        trainer.train()
    # evaluations 2-6 kept their outputs
    assert len(trainer.all_hidden) == 5 * 40
    leaks = [f for f in cb.findings if f.kind == "leak"]
    assert leaks and {f.stage for f in leaks} == {"train"}, [f.to_dict() for f in leaks]
    assert any(f.culprit and "all_hidden" in f.culprit for f in leaks), \
        [f.to_dict() for f in leaks]
    assert len([f for f in cb.current_findings() if state_of(f) == "leak"]) == 1, \
        [(f.check, f.belief, f.rule, f.culprit) for f in leaks]
    assert not any("[evaluation loop]" in str(w.message) for w in caught)
    assert cb.eval_memwatch["val"].step_count == 6 * 40
