"""The leak rule (:mod:`.rule`) and the parts it runs itself: RSS that is mostly pages of mapped
files (:mod:`.mapped_file`) and host growth no live object explains, native memory or the
allocator's retention (:mod:`.native`)."""

from memwatch.analysis.rules.leak.rule import NAME, RULE, judge

__all__ = ["NAME", "RULE", "judge"]
