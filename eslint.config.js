// The JavaScript linter's rules (eslint 9, pinned in package.json; `make test` runs
// `npx --no-install eslint static/js`). The page scripts are ES modules run in the browser: eslint's
// recommended rules, browser globals plus the three libraries base.html loads before them, and no
// name that hides a browser global (a local `history` or `status` would shadow window's).
const js = require("@eslint/js");
const globals = require("globals");

module.exports = [
  js.configs.recommended,
  {
    files: ["static/js/**/*.js"],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "module",
      globals: {...globals.browser, htmx: "readonly", Idiomorph: "readonly", Plotly: "readonly"},
    },
    rules: {
      "no-shadow": ["error", {builtinGlobals: true}],
      "no-redeclare": ["error", {builtinGlobals: true}],
    },
  },
  {
    files: ["eslint.config.js"],
    languageOptions: {sourceType: "commonjs", globals: globals.node},
  },
];
