// The words the page scripts write, in the page's language. The server translates them (_() in the
// templates and app/pages/*.py) and writes each script's set as JSON in one attribute, data-<set>-words:
//   request    templates/base.html, <body>: a failed htmx request or an unreadable figure (explorer-*.js)
//   generate   templates/generate.html: the writing page's status, a token's story, its table (generate.js),
//              the steer editor's rows (steer-rows.js)
//   train      templates/train.html: a run's status names, Play and Pause, the slider's step (train.js)
//   copy       templates/lessons/_layout.html: the snippet's Copy button (lessons.js)
//   class      templates/class_teacher.html, class_student.html: a live class (class-teacher.js, class-student.js)
//   presenting templates/base.html's Presenting bar: a push that failed (presenting.js)
// This module is the one reader: every page script asks it, none parses an attribute of its own.
// (A figure's own words, such as a heatmap's cell readout, travel in the figure's data instead.)

const parsed = new WeakMap();  // holder element -> its words: parsed once per element htmx brings

// The words of one set ({key: text}); {} where the page has none.
export function words(set) {
  const holder = document.querySelector("[data-" + set + "-words]");
  if (!holder) return {};
  if (!parsed.has(holder)) parsed.set(holder, JSON.parse(holder.getAttribute("data-" + set + "-words")));
  return parsed.get(holder);
}

// One message of a set with its {name} placeholders filled in from `vars`; `count` picks the
// message's form for one (key + "_one") where the set has it. A key the page lacks says itself,
// so a missing translation shows as its key rather than as nothing.
export function say(set, key, vars, count) {
  const all = words(set);
  const form = count === 1 && all[key + "_one"] !== undefined ? key + "_one" : key;
  let text = all[form] !== undefined ? all[form] : key;
  for (const [k, v] of Object.entries(vars || {})) text = text.split("{" + k + "}").join(String(v));
  return text;
}
