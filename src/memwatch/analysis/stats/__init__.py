"""The statistics every rule shares: trend tests (:mod:`.trend`), the shape of one metric over one
unit and its noise floor (:mod:`.shapes`), held growth confirmed at the next check
(:mod:`.held`), and forecasts to a limit (:mod:`.forecast`). Pure functions of summaries."""
