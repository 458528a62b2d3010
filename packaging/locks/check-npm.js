// Whether an npm prefix's node_modules is exactly its package-lock.json:
// every locked package at its locked version (an optional one, e.g. of
// another platform, may be absent; a package.json may spell it `v1.0.14`)
// and nothing else.
//
//   node check-npm.js PREFIX     exit 0 when it matches; else 1, listing
//                                the differences
"use strict";
const fs = require("fs");
const path = require("path");

const root = process.argv[2];
const lock = JSON.parse(fs.readFileSync(path.join(root, "package-lock.json"), "utf8"));
const want = new Map(
  Object.entries(lock.packages || {}).filter(([k, v]) => k !== "" && !v.link),
);
const bad = [];

function version(dir) {
  try {
    return JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
  } catch {
    return undefined;
  }
}

for (const [key, entry] of want) {
  const have = version(path.join(root, key));
  if (have === undefined) {
    if (!entry.optional && !entry.dev) bad.push(`${key}: missing, locked ${entry.version}`);
  } else if (have.replace(/^[v=]/, "") !== entry.version) {
    bad.push(`${key}: ${have}, locked ${entry.version}`);
  }
}

// Packages installed that the lock does not have.
function walk(rel) {
  const dir = path.join(root, rel, "node_modules");
  let names;
  try {
    names = fs.readdirSync(dir);
  } catch {
    return;
  }
  for (const n of names) {
    if (n.startsWith(".")) continue;
    const subs = n.startsWith("@") ? fs.readdirSync(path.join(dir, n)).map((s) => `${n}/${s}`) : [n];
    for (const s of subs) {
      const key = path.posix.join(rel, "node_modules", s);
      if (!want.has(key)) bad.push(`${key}: installed, not in the lock`);
      else walk(key);
    }
  }
}
walk("");

if (bad.length > 0) {
  console.error(`${root}: node_modules differs from package-lock.json:\n  ${bad.join("\n  ")}`);
  process.exit(1);
}
