"""Translates SAM templates offline with SAM's own translator (the samtranslator package the SAM
CLI ships), as `sam deploy` would before CloudFormation sees them, and prints the CloudFormation
JSON. For the least-privilege test (tests/tests/least_privilege.rs): what is checked is what
really deploys, the roles and policies SAM adds included. A nested template (a consumer's
templates/consumer.yaml) is a SAM template of its own, translated on its own as CloudFormation
would receive it; the test flattens the translations into one.

Usage: python translate.py <template.yaml>           prints its translation
       python translate.py <root> <nested> [...]     prints a JSON list, one translation each
(the SAM CLI's venv: .tools/sam-venv/bin/python)
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


def translate(path):
    # safe_load resolves YAML merge keys (`<<: *anchor`) as SAM CLI's own loader does.
    with open(path) as f:
        template = yaml.safe_load(f)
    # SAM needs an S3 location for code it does not build here.
    for name, resource in template.get("Resources", {}).items():
        if resource.get("Type") == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = f"s3://artifacts/{name}.zip"
    return transform(template, {}, ManagedPolicies())


def main(paths):
    translated = [translate(p) for p in paths]
    out = translated[0] if len(paths) == 1 else translated
    json.dump(out, sys.stdout, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
