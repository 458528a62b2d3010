#!/usr/bin/env python3
"""A generic gRPC client with no copy of our .proto files.

Discovers the agent's services through server reflection (grpcio-reflection),
builds message classes from the descriptors it receives, calls
sandbox.agent.v1.Agent/GetInfo dynamically, and checks health with the stock
grpcio-health-checking stubs. Prints one JSON object.

usage: grpc_generic.py TARGET   (e.g. unix:/tmp/agent.sock)
"""
import json
import sys

import grpc
from google.protobuf import descriptor_pool, json_format
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def main() -> None:
    # grpc-core sends the %-encoded socket path as :authority on unix
    # targets, which HTTP/2 servers built on hyper/h2 (tonic) reject; name
    # the authority explicitly, as the README documents.
    channel = grpc.insecure_channel(
        sys.argv[1], options=[("grpc.default_authority", "localhost")]
    )
    db = ProtoReflectionDescriptorDatabase(channel)
    services = sorted(db.get_services())
    pool = descriptor_pool.DescriptorPool(db)
    method = pool.FindMethodByName("sandbox.agent.v1.Agent.GetInfo")
    request_cls = GetMessageClass(method.input_type)
    response_cls = GetMessageClass(method.output_type)
    call = channel.unary_unary(
        "/sandbox.agent.v1.Agent/GetInfo",
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )
    info = call(request_cls(), timeout=10)
    health = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=10
    )
    print(
        json.dumps(
            {
                "services": services,
                "get_info": json_format.MessageToDict(
                    info, preserving_proto_field_name=True
                ),
                "health": health_pb2.HealthCheckResponse.ServingStatus.Name(
                    health.status
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
