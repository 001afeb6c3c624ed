/** The sidebar tab icon: a gauge, drawn in the theme's icon colour. */

import { LabIcon } from '@jupyterlab/ui-components';

const GAUGE_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M12 4a10 10 0 0 0-10 10c0 2.2.7 4.2 1.9 5.8l1.6-1.2A8 8 0 1 1 20 14c0 1.7-.5 3.3-1.5 4.6l1.6 1.2A10 10 0 0 0 12 4z"/>
    <path d="M13.4 15.4a2 2 0 1 1-2.8-2.8L17 8.5z"/>
  </g>
</svg>`;

export const budgetIcon = new LabIcon({ name: 'soba-nb:budget', svgstr: GAUGE_SVG });
