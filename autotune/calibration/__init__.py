"""Where the cost model meets measurements: the constants fit, published runs, refit reports.

- `fit`: the fit of the model's constants to measured step times (published or own);
- `published`: published training runs read into problems and layouts;
- `refit`: what a study's trials say about the constants and the memory model.
"""

from autotune.calibration.fit import fit_constants
from autotune.calibration.published import published_runs

__all__ = ["fit_constants", "published_runs"]
