"""Translates a SAM template offline with SAM's own translator (the samtranslator package the SAM
CLI ships), as `sam deploy` would before CloudFormation sees it, and prints the CloudFormation
JSON. For the least-privilege test (tests/tests/least_privilege.rs): what is checked is what
really deploys, the roles and policies SAM adds included.

Usage: python translate.py <template.yaml>   (the SAM CLI's venv: .tools/sam-venv/bin/python)
"""
import json
import os
import sys

import yaml
from samtranslator.translator.transform import transform

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


class ManagedPolicies:
    """The managed policies SAM may name by their short name, as IAM would list them."""

    NAMES = [
        "AWSLambdaBasicExecutionRole",
        "AWSLambdaVPCAccessExecutionRole",
        "AWSLambdaSQSQueueExecutionRole",
        "AWSXRayDaemonWriteAccess",
        "AWSLambdaRole",
        "AmazonSQSFullAccess",
        "SecretsManagerReadWrite",
        "CloudWatchFullAccess",
    ]

    def load(self):
        return {n: f"arn:aws:iam::aws:policy/service-role/{n}" for n in self.NAMES}


def main(path):
    with open(path) as f:
        template = yaml.safe_load(f)
    # SAM needs an S3 location for code it does not build here.
    for name, resource in template.get("Resources", {}).items():
        if resource.get("Type") == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = f"s3://artifacts/{name}.zip"
    translated = transform(template, {}, ManagedPolicies())
    json.dump(translated, sys.stdout, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
