#!/usr/bin/env python3
"""Writes nginx's configuration for specrun serve replicas from specrun.conf.template.

  render.py --listen 8000 --replica 10.0.0.5:8000 --replica 10.0.0.6:8000 \\
      > /etc/nginx/conf.d/specrun.conf
  render.py --standalone /tmp/lb --listen 127.0.0.1:8080 --replica 127.0.0.1:8001 ...

The first is an http-context file for a system nginx. --standalone DIR writes DIR/nginx.conf, a
whole configuration whose every path (temporary files, logs) lies in DIR, for an nginx run by an
unprivileged user:
  nginx -p DIR -c DIR/nginx.conf -e stderr -g 'daemon off; pid DIR/nginx.pid; error_log stderr;'
"""

import argparse
import os
import sys

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "specrun.conf.template")

STANDALONE = """\
# Written by deploy/nginx/render.py --standalone: every path is under {dir}.
worker_processes {workers};
events {{
    worker_connections 1024;
}}
http {{
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{body}}}
"""


def render(listen, replicas, max_fails, fail_timeout, access_log):
    with open(TEMPLATE, encoding="utf-8") as f:
        text = f.read()
    servers = "\n".join(
        f"    server {replica} max_fails={max_fails} fail_timeout={fail_timeout};"
        for replica in replicas
    )
    for field, value in (("@SERVERS@", servers), ("@LISTEN@", listen),
                         ("@ACCESS_LOG@", access_log)):
        if field not in text:
            raise SystemExit(f"render.py: {TEMPLATE} has no {field}")
        text = text.replace(field, value)
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="8000", help="nginx's listen address (default 8000)")
    parser.add_argument("--replica", action="append", required=True, metavar="HOST:PORT",
                        help="a specrun serve replica; once per replica")
    parser.add_argument("--max-fails", type=int, default=1,
                        help="failed attempts that take a replica out (default 1)")
    parser.add_argument("--fail-timeout", default="10s",
                        help="the window of those attempts and how long it stays out (default 10s)")
    parser.add_argument("--access-log", default=None,
                        help="default: nginx's own under /var/log/nginx, DIR/access.log standalone")
    parser.add_argument("--standalone", metavar="DIR",
                        help="write DIR/nginx.conf, a whole configuration kept inside DIR")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes of a standalone configuration (default 1)")
    args = parser.parse_args()

    if args.standalone:
        directory = os.path.abspath(args.standalone)
        access_log = args.access_log or os.path.join(directory, "access.log")
        body = render(args.listen, args.replica, args.max_fails, args.fail_timeout, access_log)
        body = "".join("    " + line if line.strip() else line
                       for line in body.splitlines(keepends=True))
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "nginx.conf"), "w", encoding="utf-8") as f:
            f.write(STANDALONE.format(dir=directory, workers=args.workers, body=body))
    else:
        access_log = args.access_log or "/var/log/nginx/specrun.access.log"
        sys.stdout.write(render(args.listen, args.replica, args.max_fails, args.fail_timeout,
                                access_log))


if __name__ == "__main__":
    main()
