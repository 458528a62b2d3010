"""Klavis's AcquireLocalSandboxRequest as a pydantic model, written from
its OpenAPI schema (local-sandbox-openapi.json), used as the reference for
sandbox-host's validation: for each JSON body on argv, prints what FastAPI
would answer: {"valid": {...}} or {"detail": [...]} (the 422 body).

    python3 klavis_model.py '<json body>' ...
"""
import json
import sys
from enum import Enum
from typing import List, Literal, Optional, Union

from pydantic import BaseModel, Field, ValidationError


class LocalSandboxMCPServer(str, Enum):
    filesystem = "filesystem"
    git = "git"
    terminal = "terminal"
    desktop_commander = "desktop-commander"
    arxiv = "arxiv"
    excel = "excel"
    word = "word"
    powerpoint = "powerpoint"
    code_executor = "code-executor"
    code_runner = "code-runner"
    pdf_tools = "pdf-tools"
    google_cloud = "google_cloud"
    poste_email_toolathlon = "poste_email_toolathlon"
    canvas = "canvas"
    localmemory = "localmemory"
    playwright = "playwright"


class BenchmarkEnum(str, Enum):
    MCP_Atlas = "MCP_Atlas"
    Toolathlon = "Toolathlon"
    MCP_Mark = "MCP_Mark"


class AcquireLocalSandboxRequest(BaseModel):
    server_names: Union[List[LocalSandboxMCPServer], Literal["ALL"]]
    benchmark: Optional[BenchmarkEnum] = None
    test_account_email: Optional[str] = None
    ttl_seconds: Optional[int] = Field(7200, ge=60, le=86400)


def answer(body):
    try:
        # As FastAPI does: the JSON parsed first, then the model validated.
        m = AcquireLocalSandboxRequest.model_validate(json.loads(body))
        return {"valid": m.model_dump(mode="json")}
    except ValidationError as e:
        # FastAPI's 422: each error's loc under "body", without pydantic's url.
        return {"detail": [dict(err, loc=["body", *err["loc"]])
                           for err in e.errors(include_url=False)]}


if __name__ == "__main__":
    print(json.dumps([answer(b) for b in sys.argv[1:]]))
