"""The lenserve client SDK: talk to a running scheduler service over gRPC.

    from lenserve.client import Client, AsyncClient

    with Client("127.0.0.1:50051") as client:
        for out in client.generate("Hello", SamplingParams(max_tokens=16)):
            print(out.outputs[0].text, end="", flush=True)

``AsyncClient`` has ``AsyncEngine``'s call shape (``generate``, ``abort``, ``stats``), so code
written against the in-process engine runs unchanged against a remote scheduler."""
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.outputs import CompletionOutput, RequestOutput
from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.client import AsyncClient, Client

__all__ = ["AsyncClient", "Client", "CompletionOutput", "InvalidRequestError", "RequestOutput",
           "SamplingParams"]
