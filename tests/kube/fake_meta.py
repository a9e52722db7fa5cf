"""Metadata-only answers, as the API server gives them (k8s.io/apiserver's handlers/response.go
``asPartialObjectMetadata(List)`` and the media-type negotiation before it), for the stand-in
(tests/kube/fake_api.py).

The ``Accept`` header is read as the server reads it: its media types in order, the first one
the stand-in can serve wins. ``application/json`` (or ``*/*``, ``application/*``) alone: the
objects as stored. With ``;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`` (or ``v1beta1``)
a list answers ``PartialObjectMetadataList`` whose items are ``PartialObjectMetadata``
(``apiVersion``, ``kind``, ``metadata``: nothing else of the object); ``as=PartialObjectMetadata``
does so for one object and for each watch event's object. A list asked as the single kind, or
an object as the list, is 406 NotAcceptable, as the real server answers; a watch asked as the
list kind cannot encode its first event and ends there (the real server logs "unable to encode
watch object" and closes). A ``Status`` (an error, a watch's ERROR event) is never converted.
No media type it can serve (only protobuf, yaml, a Table): 406. With ``partial`` False the
conversion is not served at all, as a server too old to know it: its media types are passed
over and a plain ``application/json`` later in the header is what answers (client-go's metadata
client lists it last for that server). Not modelled: protobuf, yaml and Table answers (the
agent never asks for them).
"""

from __future__ import annotations

from typing import Any

GROUP = "meta.k8s.io"
ITEM = "PartialObjectMetadata"
LIST = "PartialObjectMetadataList"
_JSON = {"application/json", "application/*", "*/*"}
_SERVED_AS = {(GROUP, "v1"), (GROUP, "v1beta1")}
#: the server's 406 message lists what it serves; the stand-in serves JSON only
SERVED = "application/json"


class NotAcceptable(Exception):
    """406: no media type of the Accept header can be served for this answer."""


def negotiate(accept: str | None, partial: bool = True) -> tuple[str, str] | None:
    """(kind, apiVersion) the answer is converted to, or None for the objects as stored;
    NotAcceptable when no media type listed can be served."""
    if not accept:
        return None
    for clause in accept.split(","):
        media, *params = (p.strip() for p in clause.split(";"))
        said = dict(p.split("=", 1) for p in params if "=" in p)
        if media.lower() not in _JSON:
            continue
        if "as" not in said:
            return None
        version = said.get("v")
        if partial and said["as"] in (ITEM, LIST) and (said.get("g"), version) in _SERVED_AS:
            return said["as"], f"{GROUP}/{version}"
    raise NotAcceptable(f"only the following media types are accepted: {SERVED}")


def convert(obj: dict[str, Any], target: tuple[str, str] | None) -> dict[str, Any]:
    """``obj`` as ``target`` asks (`negotiate`); NotAcceptable for a list asked as one object
    or an object asked as a list."""
    if target is None or obj.get("kind") == "Status":
        return obj
    kind, api_version = target
    is_list = isinstance(obj.get("items"), list)
    if is_list != (kind == LIST):
        what = "a list" if is_list else "not a list"
        raise NotAcceptable(f"you requested {kind}, but the requested object is {what}")
    if not is_list:
        return _partial(obj, api_version)
    return {
        "kind": LIST,
        "apiVersion": api_version,
        "metadata": dict(obj.get("metadata") or {}),
        "items": [_partial(item, api_version) for item in obj["items"]],
    }


def _partial(obj: dict[str, Any], api_version: str) -> dict[str, Any]:
    return {"kind": ITEM, "apiVersion": api_version, "metadata": dict(obj.get("metadata") or {})}
