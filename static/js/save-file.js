// Saving what a page computed as a file the reader downloads, and one CSV cell as RFC 4180 writes it: the
// pages' CSV and JSON downloads (explorer figures, generation, attribution, features) all go through here.

// A value as one CSV cell: empty for a missing value, quoted (inner quotes doubled) when it holds a comma,
// a quote or a line break.
export function csvCell(value) {
  if (value === null || value === undefined) return "";
  const s = String(value);
  return /[",\n\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
}

// The text as a download named fileName; the object URL is released once the click has been handled.
export function saveFile(fileName, type, text) {
  const url = URL.createObjectURL(new Blob([text], {type: type}));
  const a = document.createElement("a");
  a.href = url;
  a.download = fileName;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(function () { URL.revokeObjectURL(url); }, 1000);
}
