// Starts Swagger UI on /docs from the schema URL in the page's data attribute.
// validatorUrl: null stops Swagger UI sending the schema to validator.swagger.io (no outbound requests).
const root = document.getElementById("swagger-ui");
if (root && typeof window.SwaggerUIBundle === "function") {
  window.ui = window.SwaggerUIBundle({
    url: root.dataset.openapiUrl,
    domNode: root,
    validatorUrl: null,
    // deepLinking puts a link inside each operation's summary button: nested controls that a screen
    // reader cannot operate (axe: nested-interactive)
    deepLinking: false,
    tryItOutEnabled: true,
    defaultModelsExpandDepth: 0,
  });
}
