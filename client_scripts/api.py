"""The HTTP API in front of Triton (FastAPI).

Run: uvicorn api:app --app-dir client_scripts --host 127.0.0.1 --port 8080

Endpoints (OpenAPI docs at /docs, the spec at /openapi.json):
  POST /classify   multipart `file` -> {"label", "probability", "model"}; ?model= picks a variant
  POST /caption    multipart `file` -> {"caption", "label", "probability", "model"}
  GET  /healthz    the process is alive
  GET  /readyz     Triton is ready and the models this API needs are READY (else 503)

Configuration from the environment (read once, at start-up):
  TRITON_URL              host:port of Triton's HTTP endpoint (default 127.0.0.1:8000)
  API_CLASSIFIER_MODEL    the default variant of /classify (default batching_food_classifier)
  API_CLASSIFIER_MODELS   the variants ?model= may name, comma-separated
                          (default food_classifier,gpu_food_classifier,batching_food_classifier,multigpu_food_classifier)
  API_CAPTION_MODEL       the model behind /caption (default ensemble)
  API_MAX_UPLOAD_BYTES    the largest accepted upload (default 10485760, 10 MiB)
  API_TRITON_TIMEOUT_S    how long one Triton request may take before the API answers 504 (default 30)

Errors are JSON `{"detail": "..."}`: 400 the upload is not a usable image (empty,
neither an image nor base64, truncated, too many pixels: Triton's own message), 413 the upload
is over the limit, 422 the request does not match the schema (no `file`, an
unknown model), 503 Triton is unreachable or a model is not ready, 504 Triton
did not answer in time, 502 Triton failed in some other way.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

import aiohttp
import numpy as np
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from fastapi import FastAPI, File, HTTPException, Query, Request, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from tritonclient.utils import InferenceServerException

log = logging.getLogger("api")

CLASSIFIER_VARIANTS = "food_classifier,gpu_food_classifier,batching_food_classifier,multigpu_food_classifier"
INPUT_NAME = "INPUT_IMAGE"  # the models' input tensor (the seed's own FastAPI app sent "INPUT", which no model has)
# Room for the multipart framing (boundaries, part headers) around the file itself.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Settings:
    """The API's configuration; see the module docstring for the variables."""

    triton_url: str
    classifier_model: str
    classifier_models: tuple[str, ...]
    caption_model: str
    max_upload_bytes: int
    triton_timeout_s: float

    @classmethod
    def from_env(cls, env: dict | None = None) -> Settings:
        env = os.environ if env is None else env
        triton_url = env.get("TRITON_URL", "127.0.0.1:8000").strip()
        # tritonclient wants host:port; accept a pasted http:// URL too.
        for scheme in ("http://", "https://"):
            triton_url = triton_url.removeprefix(scheme)
        default = env.get("API_CLASSIFIER_MODEL", "batching_food_classifier").strip()
        variants = [m.strip() for m in env.get("API_CLASSIFIER_MODELS", CLASSIFIER_VARIANTS).split(",") if m.strip()]
        if default not in variants:
            variants.append(default)
        settings = cls(
            triton_url=triton_url.rstrip("/"),
            classifier_model=default,
            classifier_models=tuple(variants),
            caption_model=env.get("API_CAPTION_MODEL", "ensemble").strip(),
            max_upload_bytes=int(env.get("API_MAX_UPLOAD_BYTES", str(10 * 1024 * 1024))),
            triton_timeout_s=float(env.get("API_TRITON_TIMEOUT_S", "30")),
        )
        if settings.max_upload_bytes <= 0 or settings.triton_timeout_s <= 0:
            raise ValueError("API_MAX_UPLOAD_BYTES and API_TRITON_TIMEOUT_S must be positive")
        return settings

    @property
    def needed_models(self) -> list[str]:
        """What /readyz waits for: the default classifier and the caption model."""
        return sorted({self.classifier_model, self.caption_model})


SETTINGS = Settings.from_env()

# The selectable variants, as an enum so that the OpenAPI spec lists them and
# FastAPI answers 422 for any other name.
ClassifierModel = enum.Enum("ClassifierModel", {name: name for name in SETTINGS.classifier_models}, type=str)
DEFAULT_CLASSIFIER = ClassifierModel(SETTINGS.classifier_model)


# --------------------------------------------------------------------------- upload size limit


class UploadTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"upload over the limit of {limit} bytes (API_MAX_UPLOAD_BYTES)")


class UploadLimitMiddleware:
    """Answer 413 for a request body over the limit, without reading it into memory.

    A declared Content-Length over the limit is refused before a byte of the
    body is read; a body without one (chunked) is counted as it streams in
    and refused as soon as the count passes the limit. Pure ASGI, so it sits
    in front of FastAPI's multipart parsing.
    """

    def __init__(self, app, max_upload_bytes: int):
        self.app = app
        self.limit = max_upload_bytes
        self.max_body = max_upload_bytes + MULTIPART_OVERHEAD_BYTES

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            response = JSONResponse({"detail": UploadTooLarge(self.limit).detail}, status_code=413)
            return await response(scope, receive, send)

        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    # FastAPI re-raises an HTTPException from body parsing as that response.
                    raise UploadTooLarge(self.limit)
            return message

        await self.app(scope, counting_receive, send)


# --------------------------------------------------------------------------- Triton


@asynccontextmanager
async def lifespan(app: FastAPI):
    """One shared asyncio Triton client for the life of the process."""
    # The aiohttp session's own timeout is a backstop; each call has its own (below).
    app.state.triton = triton_aio.InferenceServerClient(SETTINGS.triton_url, conn_timeout=SETTINGS.triton_timeout_s + 5)
    log.info(
        "Triton at %s; classifier %s; caption model %s",
        SETTINGS.triton_url,
        SETTINGS.classifier_model,
        SETTINGS.caption_model,
    )
    try:
        yield
    finally:
        await app.state.triton.close()


class TritonUnavailable(Exception):
    """Triton cannot be reached, or the model is not loaded: 503."""


async def call_triton(coroutine, timeout_s: float = SETTINGS.triton_timeout_s):
    """Await a tritonclient call; turn what can go wrong into the right HTTP status."""
    try:
        return await asyncio.wait_for(coroutine, timeout_s)
    except asyncio.TimeoutError:
        raise HTTPException(504, f"Triton at {SETTINGS.triton_url} did not answer within {timeout_s:g} s") from None
    except (aiohttp.ClientConnectionError, ConnectionError) as error:
        raise TritonUnavailable(f"Triton at {SETTINGS.triton_url} is unreachable ({type(error).__name__})") from None
    except aiohttp.ClientError as error:
        raise HTTPException(502, f"bad answer from Triton: {error}") from None
    except InferenceServerException as error:
        raise triton_error(error) from None


def triton_error(error: InferenceServerException) -> Exception:
    """Triton's error -> ours. Its 400 is the client's only when it is about the image."""
    message = error.message() or str(error)
    status = error.status()
    if status == "400" and INPUT_NAME in message:
        # Our models' INVALID_ARG for an unusable image: "INPUT_IMAGE item 0: truncated ...".
        return HTTPException(400, message)
    # "Request for unknown model: 'x' is not found" (404), "... has no available versions" (400).
    if status in ("404", "503") or "unknown model" in message or "not ready" in message:
        return TritonUnavailable(f"model not available on Triton: {message}")
    return HTTPException(502, f"Triton failed (HTTP {status}): {message}")


async def read_upload(file: UploadFile) -> bytes:
    """The uploaded bytes; 400 for an empty file, 413 over the limit (the middleware counts the body too)."""
    data = await file.read(SETTINGS.max_upload_bytes + 1)
    if len(data) > SETTINGS.max_upload_bytes:
        raise UploadTooLarge(SETTINGS.max_upload_bytes)
    if not data:
        raise HTTPException(400, "empty upload: the file has no bytes")
    return data


async def infer(request: Request, model: str, image: bytes, outputs: list[str]) -> dict[str, object]:
    """One image through one model; {output name: first element, decoded}."""
    # The upload as it came: the models take an image file's bytes (or base64) as they are.
    items = np.array([[image]], dtype=np.object_)
    tensor = triton_http.InferInput(INPUT_NAME, list(items.shape), "BYTES")
    tensor.set_data_from_numpy(items)
    requested = [triton_http.InferRequestedOutput(name) for name in outputs]
    result = await call_triton(request.app.state.triton.infer(model, [tensor], outputs=requested))
    answer = {}
    for name in outputs:
        value = result.as_numpy(name)
        if value is None or value.size == 0:
            raise HTTPException(502, f"{model} returned no {name}")
        value = value.reshape(-1)[0]
        answer[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else float(value)
    return answer


# --------------------------------------------------------------------------- the app


class Classification(BaseModel):
    label: str = Field(description="the predicted Food-11 class", examples=["Soup"])
    probability: float = Field(description="its softmax probability, in (0, 1]", examples=[0.958])
    model: str = Field(description="the Triton model that answered", examples=["batching_food_classifier"])


class Caption(BaseModel):
    caption: str = Field(description="the caption, conditioned on the label", examples=["a photo of soup, ..."])
    label: str = Field(description="the Food-11 label the caption was conditioned on", examples=["Soup"])
    probability: float = Field(description="the label's softmax probability", examples=[0.958])
    model: str = Field(description="the Triton model that answered", examples=["ensemble"])


class Readiness(BaseModel):
    status: str = Field(examples=["ready"])
    triton: str = Field(description="the Triton address this API uses", examples=["127.0.0.1:8000"])
    models: dict[str, str] = Field(description="state of each model this API serves", examples=[{"ensemble": "READY"}])
    detail: str | None = None


class ErrorBody(BaseModel):
    detail: str


ERRORS = {
    400: {"model": ErrorBody, "description": "the upload is not a usable image"},
    413: {"model": ErrorBody, "description": "the upload is over API_MAX_UPLOAD_BYTES"},
    502: {"model": ErrorBody, "description": "Triton failed"},
    503: {"model": ErrorBody, "description": "Triton unreachable or the model not ready"},
    504: {"model": ErrorBody, "description": "Triton did not answer in time"},
}

app = FastAPI(
    title="Food-11 serving API",
    description="Food-11 classification and label-conditioned captioning, served by NVIDIA Triton.",
    version="1.0",
    lifespan=lifespan,
)
app.add_middleware(UploadLimitMiddleware, max_upload_bytes=SETTINGS.max_upload_bytes)


@app.exception_handler(TritonUnavailable)
async def triton_unavailable(request: Request, error: TritonUnavailable) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=503, headers={"Retry-After": "5"})


ImageFile = Annotated[UploadFile, File(description="an image file (JPEG, PNG, ...)")]
Variant = Annotated[ClassifierModel, Query(description="the classifier variant (default: the dynamic-batching one)")]


@app.post("/classify", response_model=Classification, responses=ERRORS)
async def classify(
    request: Request,
    file: ImageFile,
    model: Variant = DEFAULT_CLASSIFIER,
) -> Classification:
    """Classify an uploaded image into one of the eleven Food-11 classes."""
    image = await read_upload(file)
    answer = await infer(request, model.value, image, ["FOOD_LABEL", "PROBABILITY"])
    return Classification(label=answer["FOOD_LABEL"], probability=answer["PROBABILITY"], model=model.value)


@app.post("/caption", response_model=Caption, responses=ERRORS)
async def caption(request: Request, file: ImageFile) -> Caption:
    """Caption an uploaded image, conditioned on the food label the classifier gives it."""
    image = await read_upload(file)
    answer = await infer(request, SETTINGS.caption_model, image, ["OUTPUT", "FOOD_LABEL", "PROBABILITY"])
    return Caption(
        caption=answer["OUTPUT"],
        label=answer["FOOD_LABEL"],
        probability=answer["PROBABILITY"],
        model=SETTINGS.caption_model,
    )


@app.get("/healthz")
async def healthz() -> dict:
    """The process is alive (says nothing about Triton: see /readyz)."""
    return {"status": "ok"}


@app.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request) -> JSONResponse:
    """Ready when Triton is ready and the default classifier and the caption model are READY."""
    client = request.app.state.triton
    served = sorted({*SETTINGS.classifier_models, SETTINGS.caption_model})
    body = {"status": "not ready", "triton": SETTINGS.triton_url, "models": {}, "detail": None}
    timeout_s = min(5.0, SETTINGS.triton_timeout_s)  # a probe must answer quickly
    try:
        index = await call_triton(client.get_model_repository_index(), timeout_s)
        server_ready = await call_triton(client.is_server_ready(), timeout_s)
    except (TritonUnavailable, HTTPException) as error:
        body["detail"] = str(error) if isinstance(error, TritonUnavailable) else error.detail
        return JSONResponse(body, status_code=503)
    states = {entry["name"]: entry.get("state", "UNKNOWN") for entry in index}
    body["models"] = {name: states.get(name, "NOT IN REPOSITORY") for name in served}
    missing = [name for name in SETTINGS.needed_models if body["models"][name] != "READY"]
    if not server_ready or missing:
        body["detail"] = f"not READY: {', '.join(missing)}" if missing else "Triton is not ready"
        return JSONResponse(body, status_code=503)
    body["status"] = "ready"
    return JSONResponse(body)
