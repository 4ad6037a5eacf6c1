"""Whole objects in an S3 bucket: written whole or not at all, read with what was recorded
beside them, listed with their times, and the uploads a killed writer left behind aborted.

An S3 object appears only when its upload completes: one PUT, or a multipart upload's
``CompleteMultipartUpload``. So a reader never sees part of a new object, and the key keeps its
previous object until then. What a failed or killed upload leaves is an incomplete multipart
upload: invisible, but stored (and billed) until aborted. A writer aborts its own on any error;
one killed outright leaves it to :func:`abort_incomplete`, which the next run calls.

Every request goes through ``storage/session.py``'s ``call`` (bounded, retried with back-off,
the give-up clock), on the filesystem of ``store`` (``checkpoint``: the checkpoint folder's
options).
"""

from __future__ import annotations

import logging
from datetime import datetime

from cocodet.storage.session import call, settings

log = logging.getLogger(__name__)
MIN_PART = 5 * 2**20  # S3's smallest part but the last


def split(url: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``."""
    bucket, _, key = url.split("://", 1)[1].partition("/")
    return bucket, key


def _deadline(size: int) -> float:
    # A request that moves ``size`` bytes: the per-request bound, plus a second per 10 MB (a
    # 300 MB checkpoint at 10 MB/s still fits one attempt).
    return settings().timeout_s + size / 10e6


async def _get(fs, bucket: str, key: str) -> tuple[bytes, dict]:
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    body = response["Body"]
    try:
        data = await body.read()
    finally:
        body.close()
    return data, dict(response.get("Metadata") or {})


def get_whole(url: str, store: str, size_hint: int = 0) -> tuple[bytes, dict]:
    """(every byte of the object at ``url``, its user metadata), from one GET: the bytes and the
    record written with them are one object's, never a mix of two uploads."""
    bucket, key = split(url)
    return call(url, "GetObject", _get, bucket, key, store=store, deadline=_deadline(size_hint or 2**30))


def put_whole(url: str, data, metadata: dict[str, str], store: str, part_bytes: int) -> None:
    """``data`` (bytes-like) as the object at ``url`` with ``metadata``, whole or not at all: one
    PUT up to ``part_bytes``, else a multipart upload whose parts are each retried, aborted on
    any error (a kill leaves it to :func:`abort_incomplete`)."""
    bucket, key = split(url)
    view = memoryview(data)
    if len(view) <= part_bytes:
        call(
            url,
            "PutObject",
            "call_s3",
            "put_object",
            store=store,
            deadline=_deadline(len(view)),
            Bucket=bucket,
            Key=key,
            Body=bytes(view),
            Metadata=metadata,
        )
        return
    _multipart(url, view, metadata, store, max(part_bytes, MIN_PART))


def _multipart(url: str, view: memoryview, metadata: dict[str, str], store: str, part_bytes: int) -> None:
    bucket, key = split(url)
    upload = call(
        url,
        "CreateMultipartUpload",
        "call_s3",
        "create_multipart_upload",
        store=store,
        Bucket=bucket,
        Key=key,
        Metadata=metadata,
    )["UploadId"]
    try:
        parts = []
        for number, start in enumerate(range(0, len(view), part_bytes), 1):
            body = bytes(view[start : start + part_bytes])
            answer = call(
                url,
                f"UploadPart {number}",
                "call_s3",
                "upload_part",
                store=store,
                deadline=_deadline(len(body)),
                Bucket=bucket,
                Key=key,
                UploadId=upload,
                PartNumber=number,
                Body=body,
            )
            parts.append({"PartNumber": number, "ETag": answer["ETag"]})
        call(
            url,
            "CompleteMultipartUpload",
            "call_s3",
            "complete_multipart_upload",
            store=store,
            Bucket=bucket,
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": parts},
        )
    except BaseException:
        _abort(url, upload, store)
        raise


def _abort(url: str, upload: str, store: str) -> None:
    """Abort one multipart upload, one attempt: a store that is down keeps it for the next run's
    :func:`abort_incomplete`."""
    from cocodet.storage.session import _attempt

    bucket, key = split(url)
    try:
        _attempt(
            url,
            "AbortMultipartUpload",
            "call_s3",
            ("abort_multipart_upload",),
            settings().timeout_s,
            {"Bucket": bucket, "Key": key, "UploadId": upload},
            store,
        )
    except Exception as e:  # noqa: BLE001 - the upload's own error is the one raised
        log.warning("%s: an incomplete upload was left for the next run to abort (%s)", url, e)


def _pages(prefix: str, operation: str, method: str, store: str, following, **request):
    """Every page of a listing ``method`` under ``prefix``; ``following(page)``: the markers of
    the page after it, or None after the last."""
    markers: dict = {}
    while markers is not None:
        page = call(prefix, operation, "call_s3", method, store=store, **request, **markers)
        yield page
        markers = following(page)


def listed(prefix: str, store: str) -> list[str]:
    """The URL of every object directly under the folder ``prefix``."""
    bucket, key = split(prefix.rstrip("/") + "/")
    pages = _pages(
        prefix,
        "ListObjectsV2",
        "list_objects_v2",
        store,
        lambda page: {"ContinuationToken": page["NextContinuationToken"]} if page.get("IsTruncated") else None,
        Bucket=bucket,
        Prefix=key,
        Delimiter="/",
    )
    return [f"s3://{bucket}/{item['Key']}" for page in pages for item in page.get("Contents", [])]


def _seconds(when) -> float:
    return when.timestamp() if isinstance(when, datetime) else float(when)


def abort_incomplete(prefix: str, store: str, before: float) -> int:
    """Abort every multipart upload directly under the folder ``prefix`` (not in folders below
    it: another run's) begun before ``before`` (seconds since the epoch): what killed writers
    left. Returns how many."""
    bucket, key = split(prefix.rstrip("/") + "/")
    pages = _pages(
        prefix,
        "ListMultipartUploads",
        "list_multipart_uploads",
        store,
        lambda page: (
            {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
            if page.get("IsTruncated")
            else None
        ),
        Bucket=bucket,
        Prefix=key,
        Delimiter="/",
    )
    left = [upload for page in pages for upload in page.get("Uploads", []) if _seconds(upload["Initiated"]) < before]
    for upload in left:
        call(
            prefix,
            "AbortMultipartUpload",
            "call_s3",
            "abort_multipart_upload",
            store=store,
            Bucket=bucket,
            Key=upload["Key"],
            UploadId=upload["UploadId"],
        )
    return len(left)


def delete(url: str, store: str) -> None:
    bucket, key = split(url)
    call(url, "DeleteObject", "call_s3", "delete_object", store=store, Bucket=bucket, Key=key)


def head(url: str, store: str) -> dict | None:
    """``{"modified": seconds, "size": bytes, "metadata": {...}}`` of the object at ``url``, or None."""
    bucket, key = split(url)
    try:
        answer = call(url, "HeadObject", "call_s3", "head_object", store=store, Bucket=bucket, Key=key)
    except FileNotFoundError:
        return None
    return {
        "modified": _seconds(answer["LastModified"]),
        "size": int(answer["ContentLength"]),
        "metadata": dict(answer.get("Metadata") or {}),
    }
