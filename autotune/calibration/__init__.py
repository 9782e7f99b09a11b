"""Where the cost model meets measurements: the one constants fit and the published runs.

- `fit`: the fit of the model's constants to measured step times (published or own);
- `published`: published training runs read into problems and layouts;
"""

from autotune.calibration.fit import fit_constants
from autotune.calibration.published import published_runs

__all__ = ["fit_constants", "published_runs"]
