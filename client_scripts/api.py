"""The HTTP API in front of Triton (FastAPI).

Run: uvicorn api:app --app-dir client_scripts --host 127.0.0.1 --port 8080
Configuration from the environment: TRITON_URL (host:port of Triton's HTTP endpoint).
"""

from __future__ import annotations

import os

from fastapi import FastAPI

TRITON_URL = os.environ.get("TRITON_URL", "127.0.0.1:8000")

app = FastAPI(title="Food-11 serving API")


@app.get("/healthz")
async def healthz() -> dict:
    """The process is alive (says nothing about Triton: see /readyz)."""
    return {"status": "ok"}
