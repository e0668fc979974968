"""The peer for bench/api.py: a bare FastAPI endpoint returning a pool-sized JSON document."""

from __future__ import annotations

from fastapi import FastAPI

app = FastAPI()
DOC = {"kind": "Pool", "id": "0" * 36, "name": "bench-pool", "provider": "aws-main",
       "region": "aws-us-east-1", "gpu_type": "H100-80G", "purchase_type": "on_demand",
       "gpus": 64, "price_per_gpu_hour": "3.933750", "generation": 1, "status": {}}  # fmt: skip


@app.get("/doc")
def doc() -> dict[str, object]:
    return DOC
