// The dashboard page: follows /api/events and draws the run (filled in by issue 17's work).
"use strict";
