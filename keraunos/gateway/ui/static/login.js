// The login page: say so when the last attempt failed (the server redirected with ?failed=1).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  if (new URLSearchParams(window.location.search).has("failed")) {
    document.getElementById("login-failed").hidden = false;
  }
});
