"""Fast JSON for large NumPy arrays: orjson serialises them directly, at full precision.

JSON has no infinity: masked scores (-inf) and any NaN become null (ARCHITECTURE.md, conventions).
Arrays are written without going through Python lists or pydantic validation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from starlette.responses import JSONResponse

OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def _default(obj: Any) -> Any:
    # orjson writes only C-contiguous arrays itself; head-axis views (hook_q ...) are not.
    if isinstance(obj, np.ndarray):
        return np.ascontiguousarray(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def dumps(content: Any) -> bytes:
    return orjson.dumps(content, default=_default, option=OPTIONS)


class FastJSONResponse(JSONResponse):  # a JSONResponse, so the OpenAPI shows response_model
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)
