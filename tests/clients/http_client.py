#!/usr/bin/python3
"""Python's standard library against specd's HTTP API, as a script without dependencies would
call it: urllib for a completion and a chat, http.client reading a server-sent event stream line
by line.

usage: http_client.py PORT MODEL PROMPT
prints one JSON object: {"completion": text, "chat": text, "stream": text, "stream_usage": {...},
"events": N, "done": bool, "error_status": int, "error": {...}}
"""
import http.client
import json
import sys
import urllib.error
import urllib.request


def post(port, path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)


def main():
    port, model, prompt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    common = {"model": model, "temperature": 0, "max_tokens": 16, "ignore_eos": True,
              "num_speculative_tokens": 4}
    out = {}
    out["completion"] = post(port, "/v1/completions", dict(common, prompt=prompt))["choices"][0]["text"]
    chat = post(port, "/v1/chat/completions",
                dict(common, messages=[{"role": "user", "content": prompt}]))
    out["chat"] = chat["choices"][0]["message"]["content"]

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/completions",
                       body=json.dumps(dict(common, prompt=prompt, stream=True,
                                            stream_options={"include_usage": True})),
                       headers={"Content-Type": "application/json"})
    reply = connection.getresponse()
    assert reply.status == 200, reply.status
    assert reply.getheader("Content-Type").startswith("text/event-stream")
    text, events, done, usage = "", 0, False, None
    for raw in reply:  # one line at a time, as the events arrive
        line = raw.decode().rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        events += 1
        chunk = json.loads(data)
        for choice in chunk["choices"]:
            text += choice["text"]
        if chunk.get("usage"):
            usage = chunk["usage"]
    connection.close()
    out.update(stream=text, events=events, done=done, stream_usage=usage)

    try:
        post(port, "/v1/completions", dict(common, prompt=prompt, temperature=5))
        out["error_status"] = 200
    except urllib.error.HTTPError as e:
        out["error_status"] = e.code
        out["error"] = json.load(e)["error"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
