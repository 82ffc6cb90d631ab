"""Compare an HF safetensors checkpoint with its GGUF conversion, tensor by tensor.

    report = compare("drafter/model.safetensors", "drafter-q4_k.gguf")
    print(render_table(report)); sys.exit(report.exit_code)

Modules: names (HF -> GGUF name maps), source (safetensors without torch),
gguf_side (GGUF reading + chunked dequantize), transforms (known intentional
differences), metrics (error stats + tolerance table), report (records + output).
"""
from .errors import BadInput
from .metrics import DEFAULT_TOLERANCE
from .report import Report, TensorResult, render_table, to_json
from .run import compare

__all__ = ["BadInput", "DEFAULT_TOLERANCE", "Report", "TensorResult", "compare", "render_table", "to_json"]
