def messages(response) -> str:
    """All `detail[].msg` of an error response, joined, for substring checks."""
    return " | ".join(d["msg"] for d in response.json()["detail"])
