/** The icons: a gauge for the sidebar tab, a capsule for `.capsule.md` files, both drawn
 * in the theme's icon colour (`jp-icon3`) like JupyterLab's own. */

import { LabIcon } from '@jupyterlab/ui-components';

const GAUGE_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M12 4a10 10 0 0 0-10 10c0 2.2.7 4.2 1.9 5.8l1.6-1.2A8 8 0 1 1 20 14c0 1.7-.5 3.3-1.5 4.6l1.6 1.2A10 10 0 0 0 12 4z"/>
    <path d="M13.4 15.4a2 2 0 1 1-2.8-2.8L17 8.5z"/>
  </g>
</svg>`;

/** A pill lying on the diagonal: one half filled, the other outlined. */
const CAPSULE_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161" transform="rotate(-45 12 12)">
    <path d="M6 7h6v10H6a5 5 0 0 1 0-10z"/>
    <path fill-rule="evenodd" d="M12 7h6a5 5 0 0 1 0 10h-6zm1.5 1.5v7H18a3.5 3.5 0 0 0 0-7z"/>
  </g>
</svg>`;

export const budgetIcon = new LabIcon({ name: 'soba-nb:budget', svgstr: GAUGE_SVG });
export const capsuleIcon = new LabIcon({ name: 'soba-nb:capsule', svgstr: CAPSULE_SVG });
