"""MLflow basic-auth `authorization_function` that answers an unknown user exactly as a wrong password.

MLflow's own function (`mlflow.server.auth:authenticate_request_basic_auth`) returns at once for a user name it
does not know, but hashes the password (werkzeug PBKDF2/scrypt, tens to hundreds of ms) for one it knows: the
time of a refused login tells which user names exist. Here an unknown name is checked against a decoy hash made
the same way, then refused with MLflow's own 401 response, so both refusals cost one hash and read the same.
The class server's basic_auth.ini names this function (pipeline.server.command); the server process imports it.
"""

from __future__ import annotations

import secrets

from flask import Response, request
from werkzeug.datastructures import Authorization
from werkzeug.security import check_password_hash, generate_password_hash

_DECOY_HASH = generate_password_hash(secrets.token_urlsafe(24))  # the store's method and cost: werkzeug's defaults


def authenticate_request() -> Authorization | Response:
    from mlflow.server import auth as mlflow_auth  # the auth app imports this module while it starts

    credentials = request.authorization
    if credentials is not None and credentials.username and not mlflow_auth.store.has_user(credentials.username):
        check_password_hash(_DECOY_HASH, credentials.password or "")
        return mlflow_auth.make_basic_auth_response()
    return mlflow_auth.authenticate_request_basic_auth()
