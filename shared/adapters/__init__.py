"""Adapters behind the ports: the only modules that import boto3 or kubernetes."""
