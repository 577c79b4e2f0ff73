"""The evaluation loop is watched on its own: outputs accumulated across evaluations are reported
as a leak of the evaluation loop (``stage == "val"``), with their holder, and training's series
stay clean."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_helpers import EvalLeakTrainer, Tokens, make_args, tiny_bert

from memwatch import MemWatchWarning
from memwatch.integrations.transformers import MemWatchCallback


@pytest.mark.fresh_process
def test_outputs_kept_across_evaluations_are_an_evaluation_leak(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False)
    args = make_args(tmp_path, num_train_epochs=5, eval_strategy="epoch", logging_steps=50)
    trainer = EvalLeakTrainer(tiny_bert(hidden_states=True), args, train_dataset=Tokens(40),
                              eval_dataset=Tokens(8 * 40), callbacks=[cb])
    with pytest.warns(MemWatchWarning) as caught:
        trainer.train()
    # evaluations 2-5 kept their outputs (five evaluations: the verdict is due by the end of the
    # second evaluation after the leak starts; one more leaves margin on a loaded machine)
    assert len(trainer.all_hidden) == 4 * 40
    val = [f for f in cb.findings if f.kind == "leak" and f.evidence.get("stage") == "val"]
    assert val, [f.to_dict() for f in cb.findings]
    assert any(f.culprit and "all_hidden" in f.culprit for f in val), [f.to_dict() for f in val]
    assert not [f for f in cb.findings if f.kind == "leak" and "stage" not in f.evidence]
    assert any("[evaluation loop]" in str(w.message) for w in caught)
    assert cb.eval_memwatch["val"].step_count == 5 * 40
    assert any(r.get("memwatch/val/findings/leak", 0) >= 1 for r in trainer.state.log_history)
